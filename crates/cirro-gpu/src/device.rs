//! The device: one wgpu adapter over Vulkan (a real GPU, or Mesa's lavapipe
//! in tests), opened by a node's `Accelerator` on first use and kept for
//! the node; compiled
//! kernels cached by their WGSL source; counters of dispatches, kernels and
//! transfers that tests and EXPLAIN ANALYZE read.
//!
//! No device (no Vulkan loader, no driver, `VK_ICD_FILENAMES` pointed at
//! nothing, or `CIRRO_GPU=off`) is not an error: [`device`] is `None` and
//! every operator stays on the CPU.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use std::time::Instant;

use wgpu::util::DeviceExt;

/// Threads of one workgroup in every kernel.
pub const WORKGROUP: u32 = 256;

/// Device errors kept for threads that have not waited yet.
const MAX_ERRORS: usize = 64;

/// Workgroups along one dimension of a dispatch (WebGPU's and Vulkan's
/// guaranteed minimum); larger dispatches spread over y.
const MAX_GROUPS_X: u32 = 65_535;

/// A failure on the device: the operator falls back to the CPU for the
/// block, or reports it.
#[derive(Debug, Clone)]
pub struct GpuError(pub String);

impl std::fmt::Display for GpuError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GPU: {}", self.0)
    }
}

impl std::error::Error for GpuError {}

pub type GpuResult<T> = std::result::Result<T, GpuError>;

/// What the device has done since the process started.
#[derive(Debug, Default)]
pub struct Counters {
    /// Kernel dispatches.
    pub dispatches: AtomicU64,
    /// Kernels compiled (WGSL to a pipeline).
    pub compiles: AtomicU64,
    /// Kernels found compiled in the cache.
    pub cache_hits: AtomicU64,
    /// Bytes copied to the device.
    pub bytes_to_device: AtomicU64,
    /// Bytes copied back to host memory.
    pub bytes_from_device: AtomicU64,
    /// Time spent copying, in nanoseconds.
    pub transfer_nanos: AtomicU64,
    /// Time spent waiting for kernels, in nanoseconds.
    pub kernel_nanos: AtomicU64,
}

/// A snapshot of [`Counters`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CounterValues {
    pub dispatches: u64,
    pub compiles: u64,
    pub cache_hits: u64,
    pub bytes_to_device: u64,
    pub bytes_from_device: u64,
    pub transfer_nanos: u64,
    pub kernel_nanos: u64,
}

impl Counters {
    pub fn values(&self) -> CounterValues {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        CounterValues {
            dispatches: get(&self.dispatches),
            compiles: get(&self.compiles),
            cache_hits: get(&self.cache_hits),
            bytes_to_device: get(&self.bytes_to_device),
            bytes_from_device: get(&self.bytes_from_device),
            transfer_nanos: get(&self.transfer_nanos),
            kernel_nanos: get(&self.kernel_nanos),
        }
    }
}

/// The open device.
pub struct Gpu {
    device: wgpu::Device,
    queue: wgpu::Queue,
    /// The adapter's name and driver, for EXPLAIN and the benchmark.
    pub name: String,
    /// Largest storage buffer one binding may hold.
    pub max_binding: u64,
    /// Storage buffers one kernel may bind.
    pub max_bindings: u32,
    /// A software device (lavapipe): it runs on the CPU's cores.
    pub software: bool,
    kernels: Mutex<HashMap<String, Arc<wgpu::ComputePipeline>>>,
    /// Errors the device reported outside an error scope, with the thread
    /// whose call caused each (wgpu reports an error on the calling thread).
    errors: Arc<Mutex<Vec<(ThreadId, String)>>>,
    pub counters: Counters,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu").field("name", &self.name).finish()
    }
}

/// A buffer on the device with the bytes it holds.
#[derive(Debug)]
pub struct DeviceBuffer {
    pub buffer: wgpu::Buffer,
    pub bytes: u64,
}

/// A copy of a buffer's first `bytes` into `to` at byte `at` (both
/// multiples of 4).
pub struct Copy<'a> {
    pub from: &'a wgpu::Buffer,
    pub to: &'a wgpu::Buffer,
    pub at: u64,
    pub bytes: u64,
}

/// One kernel launch: a pipeline, its buffers bound at 0, 1, … in order,
/// and the threads it runs (one per row, rounded up to workgroups).
pub struct Launch<'a> {
    pub kernel: &'a wgpu::ComputePipeline,
    pub buffers: Vec<&'a wgpu::Buffer>,
    pub threads: u64,
}

impl Gpu {
    /// Open the machine's device (`CIRRO_GPU=off`: none). A node opens it
    /// once, through its [`crate::Accelerator`].
    pub fn open() -> GpuResult<Self> {
        if std::env::var("CIRRO_GPU").is_ok_and(|v| v.eq_ignore_ascii_case("off")) {
            return Err(GpuError("CIRRO_GPU=off".into()));
        }
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
            backends: wgpu::Backends::VULKAN | wgpu::Backends::METAL,
            ..wgpu::InstanceDescriptor::new_without_display_handle()
        });
        let adapter =
            futures::executor::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions {
                power_preference: wgpu::PowerPreference::HighPerformance,
                force_fallback_adapter: false,
                compatible_surface: None,
                apply_limit_buckets: false,
            }))
            .map_err(|e| GpuError(format!("no adapter: {e}")))?;
        let info = adapter.get_info();
        let available = adapter.features();
        // 64-bit integers carry BIGINT, NUMERIC(≤18) and timestamps, and
        // the hash tables' 64-bit atomics: without them the device is not
        // used.
        let needed = wgpu::Features::SHADER_INT64;
        if !available.contains(needed) {
            return Err(GpuError(format!(
                "{} lacks 64-bit integers in shaders",
                info.name
            )));
        }
        let mut features = needed;
        // 64-bit atomics, for hash tables, where the device has them.
        if available.contains(wgpu::Features::SHADER_INT64_ATOMIC_ALL_OPS) {
            features |= wgpu::Features::SHADER_INT64_ATOMIC_ALL_OPS;
        }
        let limits = adapter.limits();
        let (device, queue) =
            futures::executor::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
                label: Some("cirro"),
                required_features: features,
                required_limits: limits.clone(),
                ..Default::default()
            }))
            .map_err(|e| GpuError(format!("cannot open {}: {e}", info.name)))?;
        let errors = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&errors);
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            log::error!("GPU error: {e}");
            if let Ok(mut errors) = sink.lock() {
                // Those of threads that never waited again go first.
                if errors.len() >= MAX_ERRORS {
                    errors.remove(0);
                }
                errors.push((std::thread::current().id(), e.to_string()));
            }
        }));
        Ok(Self {
            device,
            queue,
            name: format!("{} ({}, {})", info.name, info.driver, info.driver_info),
            max_binding: u64::from(limits.max_storage_buffer_binding_size)
                .min(limits.max_buffer_size),
            max_bindings: limits.max_storage_buffers_per_shader_stage,
            software: info.device_type == wgpu::DeviceType::Cpu,
            kernels: Mutex::new(HashMap::new()),
            errors,
            counters: Counters::default(),
        })
    }

    /// The kernel compiled from `source` (entry point `main`), from the
    /// cache when it was compiled before.
    pub fn kernel(&self, source: &str) -> GpuResult<Arc<wgpu::ComputePipeline>> {
        if let Some(found) = self.kernels.lock().map_err(poisoned)?.get(source) {
            self.counters.cache_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(Arc::clone(found));
        }
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = self
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some("cirro kernel"),
                source: wgpu::ShaderSource::Wgsl(source.into()),
            });
        let pipeline = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some("cirro kernel"),
                layout: None,
                module: &module,
                entry_point: Some("main"),
                compilation_options: Default::default(),
                cache: None,
            });
        if let Some(e) = futures::executor::block_on(scope.pop()) {
            return Err(GpuError(format!("kernel does not compile: {e}\n{source}")));
        }
        self.counters.compiles.fetch_add(1, Ordering::Relaxed);
        let pipeline = Arc::new(pipeline);
        self.kernels
            .lock()
            .map_err(poisoned)?
            .insert(source.to_string(), Arc::clone(&pipeline));
        Ok(pipeline)
    }

    /// A device buffer holding `bytes` (at least 16 bytes: empty bindings
    /// are not allowed).
    pub fn upload(&self, bytes: &[u8]) -> DeviceBuffer {
        let start = Instant::now();
        let padded;
        let contents = if bytes.len() < 16 || bytes.len() % 4 != 0 {
            let mut v = bytes.to_vec();
            v.resize(bytes.len().next_multiple_of(4).max(16), 0);
            padded = v;
            &padded[..]
        } else {
            bytes
        };
        let buffer = self
            .device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: None,
                contents,
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_SRC
                    | wgpu::BufferUsages::COPY_DST,
            });
        self.counters
            .bytes_to_device
            .fetch_add(contents.len() as u64, Ordering::Relaxed);
        self.counters
            .transfer_nanos
            .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        DeviceBuffer {
            buffer,
            bytes: contents.len() as u64,
        }
    }

    /// A zeroed device buffer of `bytes` (rounded up to 16).
    pub fn scratch(&self, bytes: u64) -> DeviceBuffer {
        let bytes = bytes.next_multiple_of(4).max(16);
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: bytes,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        DeviceBuffer { buffer, bytes }
    }

    /// Run `launches` in order in one submission and wait for them.
    pub fn run(&self, launches: &[Launch<'_>]) -> GpuResult<()> {
        self.run_after(&[], launches)
    }

    /// Run `copies` (device to device), then `launches`, in order in one
    /// submission, and wait for them.
    pub fn run_after(&self, copies: &[Copy<'_>], launches: &[Launch<'_>]) -> GpuResult<()> {
        let start = Instant::now();
        let mut encoder = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        for copy in copies {
            encoder.copy_buffer_to_buffer(copy.from, 0, copy.to, copy.at, copy.bytes);
        }
        let groups: Vec<wgpu::BindGroup> = launches
            .iter()
            .map(|launch| {
                let entries: Vec<wgpu::BindGroupEntry<'_>> = launch
                    .buffers
                    .iter()
                    .enumerate()
                    .map(|(i, b)| wgpu::BindGroupEntry {
                        binding: i as u32,
                        resource: b.as_entire_binding(),
                    })
                    .collect();
                self.device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: None,
                    layout: &launch.kernel.get_bind_group_layout(0),
                    entries: &entries,
                })
            })
            .collect();
        {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: None,
                timestamp_writes: None,
            });
            for (launch, group) in launches.iter().zip(&groups) {
                let (x, y) = grid(launch.threads);
                pass.set_pipeline(launch.kernel);
                pass.set_bind_group(0, group, &[]);
                pass.dispatch_workgroups(x, y, 1);
            }
        }
        self.queue.submit([encoder.finish()]);
        self.wait()?;
        self.counters
            .dispatches
            .fetch_add(launches.len() as u64, Ordering::Relaxed);
        self.counters
            .kernel_nanos
            .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// The first `bytes` of `buffer`, copied back to host memory.
    pub fn download(&self, buffer: &wgpu::Buffer, bytes: u64) -> GpuResult<Vec<u8>> {
        self.download_at(buffer, 0, bytes)
    }

    /// `bytes` of `buffer` from `offset` (a multiple of 4), copied back.
    pub fn download_at(
        &self,
        buffer: &wgpu::Buffer,
        offset: u64,
        bytes: u64,
    ) -> GpuResult<Vec<u8>> {
        if bytes == 0 {
            return Ok(Vec::new());
        }
        let start = Instant::now();
        let size = bytes.next_multiple_of(4);
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut encoder = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        encoder.copy_buffer_to_buffer(buffer, offset, &staging, 0, size);
        self.queue.submit([encoder.finish()]);
        let (tx, rx) = std::sync::mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        self.wait()?;
        rx.recv()
            .map_err(|_| GpuError("mapping was dropped".into()))?
            .map_err(|e| GpuError(format!("cannot map: {e}")))?;
        let out = {
            let view = staging
                .get_mapped_range(..)
                .map_err(|e| GpuError(format!("cannot read: {e}")))?;
            view[..bytes as usize].to_vec()
        };
        staging.unmap();
        self.counters
            .bytes_from_device
            .fetch_add(size, Ordering::Relaxed);
        self.counters
            .transfer_nanos
            .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Ok(out)
    }

    /// Wait for the submitted work; an error the device reported meanwhile
    /// fails it.
    fn wait(&self) -> GpuResult<()> {
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| GpuError(format!("device lost: {e}")))?;
        // Only this thread's: another thread's error is its block's, which
        // that thread's own wait fails (two blocks, or two partitions, work
        // at once).
        let mut errors = self.errors.lock().map_err(poisoned)?;
        let me = std::thread::current().id();
        let first = errors.iter().position(|(thread, _)| *thread == me);
        if let Some(at) = first {
            let e = errors.remove(at).1;
            errors.retain(|(thread, _)| *thread != me);
            return Err(GpuError(e));
        }
        Ok(())
    }
}

/// Workgroups along x and y for `threads` threads; kernels number their
/// workgroup `wid.y * nwg.x + wid.x`.
pub fn grid(threads: u64) -> (u32, u32) {
    let groups = threads.div_ceil(u64::from(WORKGROUP)).max(1);
    let x = groups.min(u64::from(MAX_GROUPS_X));
    let y = groups.div_ceil(x);
    (x as u32, y as u32)
}

/// Workgroups a dispatch of `threads` runs ([`grid`]'s x times y).
pub fn groups(threads: u64) -> u64 {
    let (x, y) = grid(threads);
    u64::from(x) * u64::from(y)
}

fn poisoned<T>(_: T) -> GpuError {
    GpuError("a lock was poisoned".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error the device reports outside any error scope fails the wait
    /// of the thread whose call caused it, not another thread's (whose
    /// block would otherwise fail, and the guilty block's results count).
    #[test]
    fn a_device_error_fails_only_the_thread_that_caused_it() {
        let gpu = Arc::new(Gpu::open().expect("no Vulkan device"));
        let provoke = || {
            // MAP_READ goes with COPY_DST only: a validation error.
            let _ = gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("invalid on purpose"),
                size: 16,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::STORAGE,
                mapped_at_creation: false,
            });
        };
        std::thread::scope(|s| {
            s.spawn(|| {
                provoke();
                let same = Arc::clone(&gpu);
                let other = std::thread::spawn(move || same.wait().is_ok());
                assert!(
                    other.join().unwrap(),
                    "another thread's wait took the error"
                );
                let mine = gpu.wait();
                assert!(mine.is_err(), "the causing thread's wait missed its error");
                assert!(gpu.wait().is_ok(), "the error is reported once");
            });
        });
    }
}
