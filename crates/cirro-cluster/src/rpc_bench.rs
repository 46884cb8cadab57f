//! The worker RPC micro-benchmark (the OSU HiBD idea, applied to the gRPC
//! path the stages' rows travel): `cirro admin rpc-bench`, and `cirro bench
//! cluster --setups shuffle` at each link speed.
//!
//! Every worker serves [`RpcBenchService`] beside the task service and
//! behind the same cluster secret: `Echo` answers with the message it got,
//! `Sink` with an empty one. [`measure`], run on one node against another's
//! worker over a channel opened as the stages' channels are, gives for each
//! message size:
//! - latency: the median round trip of `Echo` (the size each way), over at
//!   most [`ROUNDS`] calls and [`TIME_PER_HALF`];
//! - throughput: the bytes per second `Sink` takes with [`WINDOW`] messages
//!   in flight on the one channel, over at most [`STREAMED`] bytes (and
//!   4,096 messages) and [`TIME_PER_HALF`].

use std::convert::Infallible;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use cirro_common::{CirroError, Result, SqlState};
use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use tonic::codegen::http;
use url::Url;

/// The message sizes measured when none are given: 1 KB to 16 MB.
pub const SIZES: [usize; 8] = [
    1 << 10,
    4 << 10,
    16 << 10,
    64 << 10,
    256 << 10,
    1 << 20,
    4 << 20,
    16 << 20,
];
/// The largest message measured.
pub const MAX_SIZE: usize = 16 << 20;
/// Room for the message's framing beyond its bytes.
const MAX_MESSAGE: usize = MAX_SIZE + 64;
/// Calls of `Echo` per size, at most.
pub const ROUNDS: usize = 50;
/// Messages in flight while measuring throughput.
pub const WINDOW: usize = 4;
/// Bytes sent to `Sink` per size, at most.
pub const STREAMED: usize = 256 << 20;
/// Time spent on either half of a size, at most (a call under way ends).
pub const TIME_PER_HALF: Duration = Duration::from_secs(2);

const SERVICE: &str = "cirro.cluster.RpcBench";
const ECHO: &str = "/cirro.cluster.RpcBench/Echo";
const SINK: &str = "/cirro.cluster.RpcBench/Sink";

/// The benchmark's gRPC service (see the module docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct RpcBenchService;

impl tonic::server::NamedService for RpcBenchService {
    const NAME: &'static str = SERVICE;
}

/// `Echo`'s and `Sink`'s handler.
#[derive(Clone, Copy)]
struct Answer {
    echo: bool,
}

impl tonic::server::UnaryService<Bytes> for Answer {
    type Response = Bytes;
    type Future =
        futures::future::Ready<std::result::Result<tonic::Response<Bytes>, tonic::Status>>;

    fn call(&mut self, request: tonic::Request<Bytes>) -> Self::Future {
        let message = request.into_inner();
        let answer = if self.echo { message } else { Bytes::new() };
        futures::future::ready(Ok(tonic::Response::new(answer)))
    }
}

impl<B> tower::Service<http::Request<B>> for RpcBenchService
where
    B: http_body::Body + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, std::result::Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<std::result::Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let echo = match request.uri().path() {
            ECHO => true,
            SINK => false,
            _ => {
                return Box::pin(async {
                    Ok(tonic::Status::unimplemented("no such method").into_http())
                });
            }
        };
        Box::pin(async move {
            let mut grpc =
                tonic::server::Grpc::new(tonic_prost::ProstCodec::<Bytes, Bytes>::default())
                    .max_decoding_message_size(MAX_MESSAGE)
                    .max_encoding_message_size(MAX_MESSAGE);
            Ok(grpc.unary(Answer { echo }, request).await)
        })
    }
}

/// The figures of one message size.
#[derive(Clone, Debug, PartialEq)]
pub struct RpcFigure {
    /// The message's size.
    pub bytes: usize,
    /// The median round trip of `Echo`, in microseconds.
    pub round_trip_us: f64,
    /// The round trips it is the median of.
    pub round_trips: usize,
    /// The messages `Sink` took in the throughput half.
    pub messages: usize,
    /// Their bytes per second, in MB (10⁶ bytes).
    pub mb_per_s: f64,
}

/// Measure the worker at `worker` (`host:port`) from here: one figure per
/// size of `sizes` (each 1 byte to [`MAX_SIZE`]). The channel is opened as
/// the stages' channels are, with `secret`.
pub async fn measure(worker: &str, secret: &str, sizes: &[usize]) -> Result<Vec<RpcFigure>> {
    if let Some(bad) = sizes.iter().find(|&&s| s == 0 || s > MAX_SIZE) {
        return Err(CirroError::new(
            SqlState::INVALID_PARAMETER_VALUE,
            format!("message size {bad}: sizes go from 1 byte to {MAX_SIZE} (16 MB)"),
        ));
    }
    let url = Url::parse(&format!("http://{worker}")).map_err(|e| {
        CirroError::new(
            SqlState::INVALID_PARAMETER_VALUE,
            format!("worker {worker}: {e}"),
        )
    })?;
    let channel = crate::distributed::ClusterChannels::new(secret)?
        .channel(&url)
        .map_err(|e| failed(worker, e))?;
    let grpc = tonic::client::Grpc::new(channel)
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE);
    let client = Client { grpc, worker };
    // Connect first: the first call's figure is not the connection's.
    client.call(ECHO, Bytes::from_static(b"hello"), 5).await?;
    let mut figures = Vec::with_capacity(sizes.len());
    for &size in sizes {
        let message = Bytes::from(vec![0xA5u8; size]);
        let mut trips = Vec::with_capacity(ROUNDS);
        let began = Instant::now();
        while trips.len() < ROUNDS && began.elapsed() < TIME_PER_HALF {
            let start = Instant::now();
            client.call(ECHO, message.clone(), size).await?;
            trips.push(start.elapsed().as_secs_f64() * 1e6);
        }
        trips.sort_by(f64::total_cmp);
        let limit = (STREAMED / size).clamp(2 * WINDOW, 4096);
        let mut in_flight = FuturesUnordered::new();
        let (mut sent, mut taken) = (0, 0);
        let began = Instant::now();
        loop {
            while in_flight.len() < WINDOW && sent < limit && began.elapsed() < TIME_PER_HALF {
                in_flight.push(client.call(SINK, message.clone(), 0));
                sent += 1;
            }
            match in_flight.next().await {
                Some(answer) => {
                    answer?;
                    taken += 1;
                }
                None => break,
            }
        }
        let seconds = began.elapsed().as_secs_f64();
        figures.push(RpcFigure {
            bytes: size,
            round_trip_us: trips[trips.len() / 2],
            round_trips: trips.len(),
            messages: taken,
            mb_per_s: (taken * size) as f64 / seconds / 1e6,
        });
    }
    Ok(figures)
}

/// Calls of one worker's benchmark service.
struct Client<'a> {
    grpc: tonic::client::Grpc<datafusion_distributed::grpc::BoxCloneSyncChannel>,
    worker: &'a str,
}

impl Client<'_> {
    /// Call `method` with `message`; the answer must have `expect` bytes.
    async fn call(&self, method: &'static str, message: Bytes, expect: usize) -> Result<()> {
        let mut grpc = self.grpc.clone();
        grpc.ready().await.map_err(|e| failed(self.worker, e))?;
        let answer = grpc
            .unary(
                tonic::Request::new(message),
                http::uri::PathAndQuery::from_static(method),
                tonic_prost::ProstCodec::<Bytes, Bytes>::default(),
            )
            .await
            .map_err(|e| failed(self.worker, e))?
            .into_inner();
        if answer.len() != expect {
            return Err(CirroError::internal(format!(
                "worker {}: {method} answered {} bytes, not {expect}",
                self.worker,
                answer.len()
            )));
        }
        Ok(())
    }
}

fn failed(worker: &str, e: impl std::fmt::Display) -> CirroError {
    CirroError::new(
        SqlState::CONNECTION_FAILURE,
        format!("worker {worker}: {e}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A worker's benchmark service on a free port, behind `secret`, on a
    /// socket set as the worker's (`spawn_worker`): without `TCP_NODELAY`
    /// a 1 KB echo waits out the peer's delayed acknowledgement (~40 ms),
    /// which CI once met.
    async fn serve(secret: &str) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let router = crate::worker::protected(secret, RpcBenchService);
        let incoming =
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        tokio::spawn(
            tonic::transport::Server::builder()
                .max_frame_size(crate::distributed::H2_MAX_FRAME)
                .initial_stream_window_size(crate::distributed::H2_STREAM_WINDOW)
                .initial_connection_window_size(crate::distributed::H2_CONNECTION_WINDOW)
                .add_service(router)
                .serve_with_incoming(incoming),
        );
        address
    }

    #[tokio::test]
    async fn measures_a_worker_and_refuses_a_wrong_secret() {
        let address = serve("s3cret").await;
        let sizes = [1 << 10, 1 << 20, MAX_SIZE];
        let figures = measure(&address, "s3cret", &sizes).await.unwrap();
        assert_eq!(figures.iter().map(|f| f.bytes).collect::<Vec<_>>(), sizes);
        for f in &figures {
            assert!(f.round_trips >= 1 && f.round_trip_us > 0.0, "{f:?}");
            assert!(f.messages >= 1 && f.mb_per_s > 0.0, "{f:?}");
        }
        // 16 MB each way takes longer than 1 KB.
        assert!(
            figures[2].round_trip_us > figures[0].round_trip_us,
            "{figures:?}"
        );

        let refused = measure(&address, "other", &sizes[..1]).await.unwrap_err();
        assert_eq!(refused.state, SqlState::CONNECTION_FAILURE);
        assert!(
            refused.message.contains("cluster secret"),
            "{}",
            refused.message
        );
        let too_big = measure(&address, "s3cret", &[MAX_SIZE + 1])
            .await
            .unwrap_err();
        assert_eq!(too_big.state, SqlState::INVALID_PARAMETER_VALUE);
    }
}
