//! The device-memory manager on the device: lazy allocation, pages made
//! dirty by a kernel's writes, eviction by the policy with write-back of
//! dirty regions, swap-in with the data intact, and a clear refusal when
//! the regions a kernel holds pass the budget.

use arrow::buffer::Buffer;
use cirro_gpu::device::Launch;
use cirro_gpu::memory::{Access, DeviceMemory, PAGE, PageState, Policy};

/// Writes `out[i] = 3 * i` over the region.
const WRITE: &str = r#"
@group(0) @binding(0) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * nwg.x + wid.x) * 256u + lid;
    if (i < arrayLength(&out)) { out[i] = 3u * i; }
}
"#;

fn words(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Region A written by a kernel (dirty), B read only (clean), then C needs
/// room for one of them: returns the manager after C is in.
fn pressure(policy: Policy) -> (DeviceMemory, [cirro_gpu::memory::RegionId; 3]) {
    let gpu = crate::common::accelerator()
        .device()
        .expect("no Vulkan device: install mesa-vulkan-drivers");
    let size = 4 * PAGE;
    let memory = DeviceMemory::new(2 * size, policy, 0.5);
    let a = memory.region(size).unwrap();
    let b = memory
        .region_with(Buffer::from_vec(vec![7u32; (size / 4) as usize]))
        .unwrap();
    let c = memory.region(size).unwrap();
    assert_eq!(memory.stats().resident, 0, "nothing allocated before use");
    let kernel = gpu.kernel(WRITE).unwrap();
    let held = memory.acquire(gpu, &[(a, Access::Write)]).unwrap();
    gpu.run(&[Launch {
        kernel: &kernel,
        buffers: vec![&held[0].buffer],
        threads: size / 4,
    }])
    .unwrap();
    memory.release(&[a]);
    assert!(memory.pages(a).iter().all(|p| *p == PageState::Dirty));
    memory.acquire(gpu, &[(b, Access::Read)]).unwrap();
    memory.release(&[b]);
    assert!(memory.pages(b).iter().all(|p| *p == PageState::Clean));
    assert_eq!(memory.stats().resident, 2 * size);
    memory.acquire(gpu, &[(c, Access::Write)]).unwrap();
    memory.release(&[c]);
    assert_eq!(memory.stats().evictions, 1);
    (memory, [a, b, c])
}

#[test]
fn cdr_drops_the_clean_region_lru_writes_back_the_dirty_one() {
    let gpu = crate::common::accelerator()
        .device()
        .expect("no Vulkan device");
    let size = 4 * PAGE;
    // CDR: B costs f·s·l = 0.5·s·1 (most recent of the two), A costs
    // s + 0.5·s·0.5: B goes, nothing is written back.
    let (memory, [a, b, _]) = pressure(Policy::Cdr);
    assert_eq!(memory.stats().written_back, 0);
    assert!(memory.pages(b).iter().all(|p| *p == PageState::Host));
    assert!(memory.pages(a).iter().all(|p| *p == PageState::Dirty));
    // LRU: A, the least recently used, goes and is written back first.
    let (memory, [a, b, _]) = pressure(Policy::Lru);
    assert_eq!(memory.stats().written_back, size);
    assert!(memory.pages(a).iter().all(|p| *p == PageState::Host));
    assert!(memory.pages(b).iter().all(|p| *p == PageState::Clean));
    // A's data survived the trip: swapped back in (evicting another), read.
    memory.acquire(gpu, &[(a, Access::Read)]).unwrap();
    memory.release(&[a]);
    let data = words(&memory.read(gpu, a).unwrap());
    assert_eq!(data.len() as u64, size / 4);
    assert!(data.iter().enumerate().all(|(i, &x)| x == 3 * i as u32));
    assert!(memory.stats().loaded >= 2 * size);
}

#[test]
fn holding_more_than_the_budget_is_refused_and_holds_nothing() {
    let gpu = crate::common::accelerator()
        .device()
        .expect("no Vulkan device");
    let memory = DeviceMemory::new(2 * PAGE, Policy::Cdr, 0.5);
    let a = memory.region(2 * PAGE).unwrap();
    let b = memory.region(PAGE).unwrap();
    let huge = memory.region(3 * PAGE).unwrap();
    // More than the whole budget: refused at once.
    let refused = memory.acquire(gpu, &[(huge, Access::Read)]).unwrap_err();
    assert!(
        refused.to_string().contains("device memory exhausted"),
        "{refused}"
    );
    memory.acquire(gpu, &[(a, Access::Write)]).unwrap();
    // A is held by a kernel: B waits until A is released (by another
    // thread, as another operator's kernel ends), then A may leave
    // (written back: it is dirty) and B comes in.
    let started = std::time::Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(std::time::Duration::from_millis(300));
            memory.release(&[a]);
        });
        memory.acquire(gpu, &[(b, Access::Read)]).unwrap();
    });
    assert!(started.elapsed() >= std::time::Duration::from_millis(300));
    assert_eq!(memory.stats().resident, PAGE);
    assert_eq!(memory.stats().written_back, 2 * PAGE);
    memory.release(&[b]);
    // Held past the wait: refused, holding nothing.
    memory.acquire(gpu, &[(a, Access::Write)]).unwrap();
    let refused = memory.acquire(gpu, &[(b, Access::Read)]).unwrap_err();
    assert!(started.elapsed() >= cirro_gpu::memory::HELD_WAIT);
    assert!(refused.to_string().contains("device memory exhausted"));
    memory.release(&[a]);
    memory.free(&[a, b, huge]);
    assert_eq!(memory.stats().resident, 0);
}

#[test]
fn the_column_cache_finds_a_column_again() {
    let memory = DeviceMemory::new(1 << 20, Policy::Cdr, 0.5);
    let load = || Buffer::from_vec(vec![1u32; 100]);
    let first = memory
        .cached("lineitem/0/l_quantity", Vec::new(), load)
        .unwrap();
    let again = memory
        .cached("lineitem/0/l_quantity", Vec::new(), || {
            panic!("loaded twice")
        })
        .unwrap();
    assert_eq!(first, again);
    assert_eq!((memory.stats().hits, memory.stats().misses), (1, 1));
    memory.release(&[first, again]);
    memory.free(&[first]);
    let reloaded = memory
        .cached("lineitem/0/l_quantity", Vec::new(), load)
        .unwrap();
    assert_ne!(first, reloaded);
}

#[test]
fn cached_columns_stay_between_uses_and_leave_under_pressure() {
    let gpu = crate::common::accelerator()
        .device()
        .expect("no Vulkan device");
    let size = 4 * PAGE;
    let memory = DeviceMemory::new(2 * size, Policy::Cdr, 0.5);
    let source = Buffer::from_vec(vec![5u32; (size / 4) as usize]);
    let pinned = source.clone();
    let column = memory
        .cached("t/0/a", vec![pinned], || source.clone())
        .unwrap();
    memory.acquire(gpu, &[(column, Access::Read)]).unwrap();
    // Held by the lookup and by the kernel: both released, it stays.
    memory.release(&[column, column]);
    assert_eq!(memory.stats().cached, size);
    let again = memory
        .cached("t/0/a", Vec::new(), || panic!("on the device already"))
        .unwrap();
    assert_eq!(again, column);
    // Held, it cannot be evicted: two more regions do not fit beside it.
    let a = memory.region(size).unwrap();
    let b = memory.region(size).unwrap();
    assert!(
        memory
            .acquire(gpu, &[(a, Access::Write), (b, Access::Write)])
            .is_err()
    );
    memory.release(&[again]);
    // Released, it is the one to go, and is dropped, not written back.
    memory
        .acquire(gpu, &[(a, Access::Write), (b, Access::Write)])
        .unwrap();
    let stats = memory.stats();
    assert_eq!(
        (stats.cached, stats.evictions, stats.written_back),
        (0, 1, 0)
    );
    let mut loaded = false;
    let back = memory
        .cached("t/0/a", Vec::new(), || {
            loaded = true;
            source.clone()
        })
        .unwrap();
    assert!(loaded, "an evicted column is loaded again");
    assert_ne!(back, column);
}
