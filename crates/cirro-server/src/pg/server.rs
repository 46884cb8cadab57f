//! The PostgreSQL protocol's server: the accept loop, one task per
//! connection (pgwire's message loop with Cirro's handlers), cancel
//! requests by pid and secret, and the watch for a client that goes away.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use cirro_common::SqlState;
use pgwire::api::cancel::CancelHandler;
use pgwire::api::{ClientInfo, ErrorHandler, PgWireServerHandlers};
use pgwire::error::{ErrorInfo, PgWireError};
use pgwire::messages::cancel::CancelRequest;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_util::codec::{Framed, FramedParts};

use crate::Shared;
use crate::pg;
use crate::session::Canceller;

/// Take connections on `listener` until Ctrl-C or `terminate` (SIGTERM);
/// each runs in a task of its own.
pub(crate) async fn accept(
    listener: TcpListener,
    shared: Arc<Shared>,
    tls: Option<TlsAcceptor>,
    mut terminate: tokio::signal::unix::Signal,
) {
    let query = Arc::new(pg::QueryHandler::new());
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = tokio::signal::ctrl_c() => break,
            _ = terminate.recv() => break,
        };
        let (socket, peer) = match accepted {
            Ok(pair) => pair,
            Err(e) => {
                log::warn!("accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = socket.set_nodelay(true);
        let canceller = Arc::new(Canceller::default());
        let handlers = Connection {
            shared: Arc::clone(&shared),
            canceller: Arc::clone(&canceller),
            query: Arc::clone(&query),
        };
        let tls = tls.clone();
        tokio::spawn(async move {
            let (socket, watcher) = match watch_disconnect(socket, Arc::clone(&canceller)) {
                Ok(pair) => pair,
                Err(e) => {
                    log::warn!("{peer}: {e}");
                    return;
                }
            };
            // pg_terminate_backend ends the connection.
            tokio::select! {
                processed = process_connection(socket, tls, handlers) => {
                    if let Err(e) = processed {
                        log::debug!("{peer}: {e}");
                    }
                }
                _ = canceller.terminated() => log::debug!("{peer}: terminated"),
            }
            watcher.abort();
            // The connection is gone: stop whatever it was running.
            canceller.cancel();
        });
    }
}

/// The handlers of one connection.
struct Connection {
    shared: Arc<Shared>,
    canceller: Arc<Canceller>,
    query: Arc<pg::QueryHandler>,
}

impl PgWireServerHandlers for Connection {
    fn simple_query_handler(&self) -> Arc<impl pgwire::api::query::SimpleQueryHandler> {
        Arc::clone(&self.query)
    }

    fn extended_query_handler(&self) -> Arc<impl pgwire::api::query::ExtendedQueryHandler> {
        Arc::clone(&self.query)
    }

    fn startup_handler(&self) -> Arc<impl pgwire::api::auth::StartupHandler> {
        Arc::new(pg::auth::ScramStartup::new(
            Arc::clone(&self.shared),
            Arc::clone(&self.canceller),
        ))
    }

    fn copy_handler(&self) -> Arc<impl pgwire::api::copy::CopyHandler> {
        Arc::clone(&self.query)
    }

    fn cancel_handler(&self) -> Arc<impl CancelHandler> {
        Arc::new(CancelBySecret(Arc::clone(&self.shared)))
    }

    fn error_handler(&self) -> Arc<impl ErrorHandler> {
        Arc::new(LogErrors)
    }
}

struct CancelBySecret(Arc<Shared>);

#[async_trait]
impl CancelHandler for CancelBySecret {
    async fn on_cancel_request(&self, request: CancelRequest) {
        let canceller = self.0.sessions.lock().ok().and_then(|sessions| {
            sessions
                .get(&request.pid)
                .filter(|(secret, _)| *secret == request.secret_key.to_bytes().to_vec())
                .and_then(|(_, canceller)| canceller.upgrade())
        });
        if let Some(canceller) = canceller {
            canceller.cancel();
        }
    }
}

struct LogErrors;

impl ErrorHandler for LogErrors {
    fn on_error<C: ClientInfo>(&self, client: &C, error: &mut PgWireError) {
        log::debug!("{}: {error}", client.socket_addr());
    }
}

/// How long a client may take to log in.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);

/// One client connection: pgwire's message loop (as in
/// `pgwire::tokio::process_socket`), except that a message that cannot be
/// decoded (truncated, an impossible length, an unknown type) gets a FATAL
/// 08P01 ErrorResponse before the connection closes; pgwire's own loop
/// closes without a word.
async fn process_connection<H: PgWireServerHandlers>(
    socket: TcpStream,
    tls: Option<TlsAcceptor>,
    handlers: H,
) -> std::io::Result<()> {
    use futures::{SinkExt, StreamExt};
    use pgwire::api::PgWireConnectionState as State;
    use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
    use pgwire::tokio::server::{negotiate_tls, process_error, process_message};

    let startup_timeout = tokio::time::sleep(STARTUP_TIMEOUT);
    tokio::pin!(startup_timeout);
    let negotiated = tokio::select! {
        _ = &mut startup_timeout => return Ok(()),
        socket = negotiate_tls(socket, tls) => socket?,
    };
    // None: direct TLS without a certificate configured.
    let Some(socket) = negotiated else {
        return Ok(());
    };
    let parts = socket.into_parts();
    let mut held = FramedParts::new(Held::new(parts.io), parts.codec);
    held.read_buf = parts.read_buf;
    held.write_buf = parts.write_buf;
    let mut socket = Framed::from_parts(held);
    let startup = handlers.startup_handler();
    let simple = handlers.simple_query_handler();
    let extended = handlers.extended_query_handler();
    let copy = handlers.copy_handler();
    let cancel = handlers.cancel_handler();
    let errors = handlers.error_handler();
    loop {
        let logging_in = matches!(
            socket.state(),
            State::AwaitingStartup | State::AuthenticationInProgress
        );
        let next = if logging_in {
            tokio::select! {
                _ = &mut startup_timeout => None,
                next = socket.next() => next,
            }
        } else {
            socket.next().await
        };
        let message = match next {
            Some(Ok(PgWireFrontendMessage::Terminate(_))) | None => break,
            Some(Ok(message)) => message,
            Some(Err(e)) => {
                // Out before the close: closing with the client's bytes
                // unread resets the connection, dropping what is held.
                socket.get_mut().hold(false);
                let info = ErrorInfo::new(
                    "FATAL".to_owned(),
                    SqlState::PROTOCOL_VIOLATION.0.to_owned(),
                    format!("invalid protocol message: {e}"),
                );
                let _ = socket
                    .send(PgWireBackendMessage::ErrorResponse(info.into()))
                    .await;
                break;
            }
        };
        let is_extended = match socket.state() {
            State::CopyInProgress(is_extended) => is_extended,
            _ => message.is_extended_query(),
        };
        // Replies up to the client's Sync (or Flush) go out together, as do
        // a simple query's.
        let holds = matches!(
            message,
            PgWireFrontendMessage::Parse(_)
                | PgWireFrontendMessage::Bind(_)
                | PgWireFrontendMessage::Describe(_)
                | PgWireFrontendMessage::Execute(_)
                | PgWireFrontendMessage::Close(_)
                | PgWireFrontendMessage::Query(_)
        );
        socket.get_mut().hold(holds);
        let processed = process_message(
            message,
            &mut socket,
            Arc::clone(&startup),
            Arc::clone(&simple),
            Arc::clone(&extended),
            Arc::clone(&copy),
            Arc::clone(&cancel),
        )
        .await;
        if let Err(mut e) = processed {
            errors.on_error(&socket, &mut e);
            process_error(&mut socket, e, is_extended).await?;
            if logging_in {
                // A failed login never leaves a connection open.
                break;
            }
        }
        // COPY waits for the client's data: what it was told goes out now.
        if !holds || !is_extended || matches!(socket.state(), State::CopyInProgress(_)) {
            socket.get_mut().hold(false);
            socket.flush().await?;
        }
    }
    socket.get_mut().hold(false);
    socket.flush().await
}

/// A connection's writes, held until the client's Sync. pgwire flushes
/// every reply of the extended protocol (ParseComplete, BindComplete, each
/// row, CommandComplete), and each flush is a `send` that wakes the client;
/// PostgreSQL buffers a round trip's replies until the client's Sync or
/// Flush and sends them as one. While held, writes gather here and flushes
/// are deferred; a reply larger than [`HELD_BYTES`] still streams (the
/// buffer goes out whenever it would grow past that). One `send` per round
/// trip instead of one per message (and no TCP_CORK toggling, two more
/// system calls each) cut the server's CPU per pgbench transaction.
struct Held<S> {
    io: S,
    buffer: Vec<u8>,
    /// How much of `buffer` went out already.
    sent: usize,
    hold: bool,
}

/// The most a connection holds before writing.
const HELD_BYTES: usize = 64 * 1024;

impl<S: AsyncWrite + Unpin> Held<S> {
    fn new(io: S) -> Self {
        Self {
            io,
            buffer: Vec::new(),
            sent: 0,
            hold: false,
        }
    }

    /// Hold (true) or let go (false: the next flush writes what is held).
    fn hold(&mut self, hold: bool) {
        self.hold = hold;
    }

    /// Write out what is held.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        while self.sent < self.buffer.len() {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.buffer[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        self.buffer.clear();
        self.sent = 0;
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Held<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if this.buffer.len() + data.len() > HELD_BYTES {
            ready!(this.poll_drain(cx))?;
            if data.len() > HELD_BYTES {
                return Pin::new(&mut this.io).poll_write(cx, data);
            }
        }
        this.buffer.extend_from_slice(data);
        Poll::Ready(Ok(data.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.hold {
            return Poll::Ready(Ok(()));
        }
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Held<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

/// Watch a connection for the client going away while a statement runs (the
/// protocol reads nothing then), and cancel the statement if it does.
fn watch_disconnect(
    socket: TcpStream,
    canceller: Arc<Canceller>,
) -> std::io::Result<(TcpStream, tokio::task::JoinHandle<()>)> {
    let std_socket = socket.into_std()?;
    let watch = TcpStream::from_std(std_socket.try_clone()?)?;
    let socket = TcpStream::from_std(std_socket)?;
    let watcher = tokio::spawn(async move {
        let mut probe = [0u8; 1];
        loop {
            if watch.readable().await.is_err() {
                break;
            }
            match watch.peek(&mut probe).await {
                Ok(0) | Err(_) => {
                    canceller.cancel();
                    break;
                }
                // Data waiting for the protocol to read: look again later.
                Ok(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    });
    Ok((socket, watcher))
}
