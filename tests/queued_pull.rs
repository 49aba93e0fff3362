//! Queued pull (ADR 0010) on the fake driver (no GPU needed): a copy
//! enqueued behind a GPU wait on the control region's `global_seq` does not
//! run before the word reaches the frame's seq and runs as soon as it does;
//! the control region is registered read-only, in the import's own
//! mapping; a wait that never opens is set aside with the buffer it writes,
//! so later copies are unaffected; a set-aside copy that completes is
//! released, and one that never does keeps what it reads (instead of
//! unregistering memory the GPU still waits on) while everything else is
//! released; a failure at any driver call of the gate's setup leaves
//! nothing registered. On a ring with a gate line (ADR 0011) the copy waits
//! on the gate word in the import's own read-only mapping of the pool
//! instead, which the publisher opens, and nothing is registered. The GPU
//! proof is `tests/gpu_commit.rs`.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use vramring::seam::cuda::{CudaImport, CudaPool, DeviceSelector, Driver};
use vramring::seam::cuda::{ExportedPool, ImportedPool};
use vramring::seam::cuda::{GateLine, QueuedCopies};
use vramring_testkit::fake::{FakeDevice, FakeDriver};

const GPU: [u8; 16] = *b"fake-gpu-0123456";
const MIB: u64 = 1 << 20;
const FRAME: u64 = MIB;
/// Where `global_seq` sits in the stand-in control region.
const WORD: u64 = 64;

/// A memfd standing in for the ring's control region, with the
/// publisher's writable mapping of it.
struct Control {
    fd: OwnedFd,
    map: memmap2::MmapMut,
}

impl Control {
    fn new() -> Control {
        let fd = rustix::fs::memfd_create("control", rustix::fs::MemfdFlags::CLOEXEC).expect("memfd");
        rustix::fs::ftruncate(&fd, 4096).expect("ftruncate");
        let file = std::fs::File::from(fd.try_clone().expect("dup"));
        // SAFETY: a fresh memfd of 4096 bytes that only this test maps.
        let map = unsafe { memmap2::MmapMut::map_mut(&file) }.expect("mmap");
        Control { fd, map }
    }
    fn global(&self) -> &AtomicU64 {
        // SAFETY: 8-byte aligned inside the page-aligned mapping, only ever
        // accessed atomically.
        unsafe { &*(self.map.as_ptr().add(WORD as usize) as *const AtomicU64) }
    }
}

fn subscriber_process(dev: FakeDevice) -> Arc<FakeDriver> {
    FakeDriver::new(vec![dev])
}

/// The publisher's pool, two frames written: slot 0 of 0x11, slot 1 of 0x22.
fn pool(d: &Arc<FakeDriver>) -> CudaPool<FakeDriver> {
    let pool = CudaPool::create(Arc::clone(d), DeviceSelector::Uuid(GPU), 4 * MIB).unwrap();
    // SAFETY: the pool's own read-write mapping, 4 MiB.
    unsafe {
        d.memset_d8(pool.base_addr(), 0x11, FRAME).unwrap();
        d.memset_d8(pool.base_addr() + FRAME, 0x22, FRAME).unwrap();
    }
    pool
}

fn import(d: &Arc<FakeDriver>, pool: &mut CudaPool<FakeDriver>) -> CudaImport<FakeDriver> {
    CudaImport::import(Arc::clone(d), pool.export_fd().unwrap(), pool.pool_bytes(), GPU, false).unwrap()
}

fn dest_bytes(d: &FakeDriver, imp: &CudaImport<FakeDriver>) -> Vec<u8> {
    let mut host = vec![0u8; FRAME as usize];
    // SAFETY: the import's own buffer holds at least FRAME bytes.
    unsafe { d.memcpy_dtoh(&mut host, imp.dest_addr()) }.unwrap();
    host
}

/// A publisher's pool and a subscriber's import of it with the gate on.
struct Gated {
    /// Kept alive for the pool's sake.
    _pubd: Arc<FakeDriver>,
    subd: Arc<FakeDriver>,
    ctl: Control,
    pool: CudaPool<FakeDriver>,
    imp: CudaImport<FakeDriver>,
}

fn gated() -> Gated {
    let pubd = FakeDriver::with_one_gpu(GPU);
    let subd = subscriber_process(FakeDevice::discrete(GPU));
    let ctl = Control::new();
    let mut pool = pool(&pubd);
    let mut imp = import(&subd, &mut pool);
    assert!(imp.enable_gate(ctl.fd.as_fd(), 4096, WORD, false).unwrap());
    Gated {
        _pubd: pubd,
        subd,
        ctl,
        pool,
        imp,
    }
}

#[test]
fn a_queued_copy_waits_for_the_commit_and_runs_when_it_lands() {
    let mut g = gated();
    assert!(g.imp.gate_enabled());
    g.ctl.global().store(4, Ordering::Release);
    // Frame 5 (slot 1) is announced but not committed.
    g.imp.copy_out_gated(5, FRAME, FRAME).unwrap();
    assert!(!g.imp.poll_complete().unwrap(), "the copy ran before its commit landed");
    assert_eq!(g.subd.blocked_streams(), 1);
    g.ctl.global().store(5, Ordering::Release);
    assert!(
        g.imp.poll_complete().unwrap(),
        "the copy did not run once the commit landed"
    );
    assert!(
        dest_bytes(&g.subd, &g.imp).iter().all(|&b| b == 0x22),
        "wrong bytes copied"
    );
    // A gate already open does not hold the copy at all.
    g.imp.copy_out_gated(5, 0, FRAME).unwrap();
    assert!(g.imp.poll_complete().unwrap());
    assert!(dest_bytes(&g.subd, &g.imp).iter().all(|&b| b == 0x11));
    // The wait was on our own read-only registration of the control region.
    let log = g.subd.log();
    assert_eq!(log.iter().filter(|r| r.call == "cuMemHostRegister_v2").count(), 1);
    assert_eq!(log.iter().filter(|r| r.call == "cuStreamWaitValue64_v2").count(), 2);
    g.imp.close().unwrap();
    g.pool.close().unwrap();
    assert!(g.subd.leaks().is_empty(), "leaked {:?}", g.subd.leaks());
}

#[test]
fn the_gate_is_refused_where_the_device_cannot_wait_or_mps_is_required_but_absent() {
    let pubd = FakeDriver::with_one_gpu(GPU);
    let ctl = Control::new();
    let mut pool = pool(&pubd);
    // No MPS: `Auto` (only_mps) does not queue.
    let subd = subscriber_process(FakeDevice::discrete(GPU));
    let mut imp = import(&subd, &mut pool);
    assert!(!imp.enable_gate(ctl.fd.as_fd(), 4096, WORD, true).unwrap());
    assert!(imp.copy_out_gated(1, 0, FRAME).is_err(), "a queued copy without a gate");
    imp.close().unwrap();
    assert!(subd.leaks().is_empty());
    // MPS: `Auto` queues.
    let mut mps = FakeDevice::discrete(GPU);
    mps.mps = true;
    let subd = subscriber_process(mps);
    let mut imp = import(&subd, &mut pool);
    assert!(imp.enable_gate(ctl.fd.as_fd(), 4096, WORD, true).unwrap());
    imp.close().unwrap();
    assert!(subd.leaks().is_empty());
    // A device without read-only registration or stream memory operations.
    let mut old = FakeDevice::discrete(GPU);
    old.stream_waits = false;
    let subd = subscriber_process(old);
    let mut imp = import(&subd, &mut pool);
    assert!(!imp.enable_gate(ctl.fd.as_fd(), 4096, WORD, false).unwrap());
    // A word outside the region is a layout error, not a silent fallback.
    let subd2 = subscriber_process(FakeDevice::discrete(GPU));
    let mut imp2 = import(&subd2, &mut pool);
    assert!(imp2.enable_gate(ctl.fd.as_fd(), 4096, 4096, false).is_err());
    imp.close().unwrap();
    imp2.close().unwrap();
    pool.close().unwrap();
}

#[test]
fn the_gate_cannot_write_the_control_region() {
    let mut g = gated();
    let word = g.imp.gate_word().expect("the gate's word");
    // SAFETY: a deliberately bad write, which the fake driver refuses (the
    // registration is read-only for the device).
    let wrote = unsafe { g.subd.memset_d8(word, 0xFF, 8) };
    assert!(wrote.is_err(), "the control region is writable through the gate");
    // Reading it is what the wait does.
    let mut host = [0u8; 8];
    // SAFETY: 8 bytes of registered memory.
    unsafe { g.subd.memcpy_dtoh(&mut host, word) }.unwrap();
    assert_eq!(g.ctl.global().load(Ordering::Acquire), 0);
    g.imp.close().unwrap();
    g.pool.close().unwrap();
}

#[test]
fn an_abandoned_copy_keeps_its_buffer_and_later_copies_use_fresh_ones() {
    let mut g = gated();
    g.ctl.global().store(1, Ordering::Release);
    g.imp.copy_out_gated(2, FRAME, FRAME).unwrap();
    let stuck_dest = g.imp.dest_addr();
    g.imp.abandon_copies().unwrap();
    // The next frame goes to a fresh stream and buffer, not behind the wait.
    g.imp.copy_out(0, FRAME).unwrap();
    g.imp.complete().unwrap();
    assert_ne!(
        g.imp.dest_addr(),
        stuck_dest,
        "a later copy shares the abandoned copy's buffer"
    );
    assert!(dest_bytes(&g.subd, &g.imp).iter().all(|&b| b == 0x11));
    // The abandoned copy's commit lands after all (a slow, live publisher):
    // it runs into its own buffer, which the next copy releases.
    g.ctl.global().store(2, Ordering::Release);
    g.imp.copy_out(0, FRAME).unwrap();
    g.imp.complete().unwrap();
    assert!(
        dest_bytes(&g.subd, &g.imp).iter().all(|&b| b == 0x11),
        "the late copy wrote our buffer"
    );
    assert_eq!(g.subd.blocked_streams(), 0);
    g.imp.close().unwrap();
    g.pool.close().unwrap();
    assert!(g.subd.leaks().is_empty(), "leaked {:?}", g.subd.leaks());
}

#[test]
fn a_copy_whose_commit_never_lands_keeps_what_it_reads_at_close_and_nothing_else() {
    let mut g = gated();
    g.imp.copy_out_gated(9, 0, FRAME).unwrap();
    g.imp.abandon_copies().unwrap();
    g.imp.copy_out(FRAME, FRAME).unwrap();
    g.imp.complete().unwrap();
    // The publisher "died": global_seq never reaches 9. Close must neither
    // unregister the word the GPU waits on (the fake fails that as a
    // fault) nor block on the stream.
    g.imp.close().unwrap();
    let leaks = g.subd.leaks();
    assert_eq!(
        leaks.host_registrations.len(),
        1,
        "the waited-on registration was dropped: {leaks:?}"
    );
    assert_eq!(
        leaks.mappings.len(),
        1,
        "the g.pool the stuck copy reads was unmapped: {leaks:?}"
    );
    assert_eq!(leaks.streams.len(), 1, "only the stuck stream may stay: {leaks:?}");
    assert_eq!(
        leaks.allocations.len(),
        1,
        "only the stuck copy's buffer may stay: {leaks:?}"
    );
    assert!(
        !g.subd.log().iter().any(|r| r.call == "cuMemHostUnregister"),
        "unregistered memory a pending wait reads"
    );
    assert_eq!(g.subd.blocked_streams(), 1);
    // Closing again is a no-op.
    g.imp.close().unwrap();
    g.pool.close().unwrap();
}

#[test]
fn a_gate_setup_that_fails_at_any_call_registers_nothing() {
    let pubd = FakeDriver::with_one_gpu(GPU);
    let ctl = Control::new();
    let mut pool = pool(&pubd);
    let probe = subscriber_process(FakeDevice::discrete(GPU));
    let mut imp = import(&probe, &mut pool);
    let before = probe.calls();
    assert!(imp.enable_gate(ctl.fd.as_fd(), 4096, WORD, false).unwrap());
    let calls = probe.calls() - before;
    imp.close().unwrap();
    assert!(calls >= 4, "gate setup made only {calls} driver calls");
    for n in 1..=calls {
        let subd = subscriber_process(FakeDevice::discrete(GPU));
        let mut imp = import(&subd, &mut pool);
        subd.fail_at(subd.calls() + n);
        let on = imp.enable_gate(ctl.fd.as_fd(), 4096, WORD, false);
        if let Ok(true) = on {
            // Only a failure the setup recovers from may leave it enabled:
            // a context pop, which is retried once.
            let failed: Vec<_> = subd.log().into_iter().filter(|r| r.failed).map(|r| r.call).collect();
            assert_eq!(failed, ["cuCtxPopCurrent_v2"], "gate enabled although call {n} failed");
        }
        imp.close().unwrap();
        assert!(subd.leaks().is_empty(), "failing call {n}: leaked {:?}", subd.leaks());
    }
    pool.close().unwrap();
}

#[test]
fn a_queued_copy_that_fails_to_enqueue_leaves_no_wait_for_close_to_block_on() {
    let mut g = gated();
    // The wait is enqueued, then the copy behind it fails.
    g.subd.fail_nth("cuMemcpyDtoDAsync_v2", 1);
    assert!(g.imp.copy_out_gated(3, 0, FRAME).is_err());
    // The stream with the dangling wait was set aside: later copies work,
    // and close never synchronises it (the fake fails a sync that a real
    // driver would block on for good).
    g.imp.copy_out(FRAME, FRAME).unwrap();
    g.imp.complete().unwrap();
    assert!(dest_bytes(&g.subd, &g.imp).iter().all(|&b| b == 0x22));
    // The commit lands: the set-aside stream completes and is released.
    g.ctl.global().store(3, Ordering::Release);
    g.imp.close().unwrap();
    g.pool.close().unwrap();
    assert!(g.subd.leaks().is_empty(), "leaked {:?}", g.subd.leaks());
    assert!(!g.subd.log().iter().any(|r| r.call == "cuStreamSynchronize" && r.failed));
}

#[test]
fn a_wait_set_aside_without_a_fresh_stream_is_still_never_synchronised() {
    let mut g = gated();
    g.imp.copy_out_gated(4, 0, FRAME).unwrap();
    // The import made its stream with the first `cuStreamCreate`; the
    // replacement fails.
    g.subd.fail_nth("cuStreamCreate", 2);
    assert!(g.imp.abandon_copies().is_err());
    // No stream to copy on now: an error, not a copy behind the wait.
    assert!(g.imp.copy_out(0, FRAME).is_err());
    // The commit never lands; close keeps what the stuck copy touches and
    // does not block on it.
    g.imp.close().unwrap();
    assert_eq!(g.subd.blocked_streams(), 1);
    assert!(!g.subd.log().iter().any(|r| r.call == "cuStreamSynchronize" && r.failed));
    g.pool.close().unwrap();
}

/// Pool offset of the gate line (ADR 0011) in these tests' 4 MiB pool,
/// past the two frames.
const GATE: u64 = 3 * MIB;

#[test]
fn a_queued_copy_waits_on_the_pools_gate_word_and_the_publisher_opens_it() {
    let pubd = FakeDriver::with_one_gpu(GPU);
    let subd = subscriber_process(FakeDevice::discrete(GPU));
    let mut pool = pool(&pubd);
    // SAFETY: a deliberately stale gate line, which enabling must clear.
    unsafe { pubd.memset_d8(pool.base_addr() + GATE, 0xFF, 64) }.unwrap();
    assert!(pool.enable_gate_line(GATE).unwrap(), "the fake device keeps a gate");
    let mut imp = import(&subd, &mut pool);
    assert!(imp.enable_pool_gate(GATE, false).unwrap());
    assert!(imp.gate_enabled());
    assert_eq!(
        imp.gate_word(),
        Some(imp.base_addr() + GATE),
        "the wait is not on the import's own mapping of the pool"
    );
    // Frame 5 (slot 1) is announced; the gate still reads 0.
    imp.copy_out_gated(5, FRAME, FRAME).unwrap();
    assert!(!imp.poll_complete().unwrap(), "the copy ran before the gate opened");
    // Frame 4's CPU commit opens the gate only as far as 4.
    pool.write_gate(GATE, 4, vramring::WriteCompletion::Host).unwrap();
    assert!(!imp.poll_complete().unwrap(), "the copy ran for an older frame's gate");
    pool.write_gate(GATE, 5, vramring::WriteCompletion::Host).unwrap();
    assert!(
        imp.poll_complete().unwrap(),
        "the copy did not run once the gate opened"
    );
    assert!(dest_bytes(&subd, &imp).iter().all(|&b| b == 0x22), "wrong bytes copied");
    // The subscriber reaches the gate only through its read-only import:
    // it cannot open other subscribers' waits with its own writes.
    let word = imp.gate_word().expect("the gate's word");
    // SAFETY: a deliberately bad write, which the read-only mapping refuses.
    assert!(unsafe { subd.memset_d8(word, 0xFF, 8) }.is_err());
    // No host memory was registered for it.
    assert_eq!(
        subd.log().iter().filter(|r| r.call == "cuMemHostRegister_v2").count(),
        0
    );
    imp.close().unwrap();
    pool.close().unwrap();
    assert!(subd.leaks().is_empty(), "leaked {:?}", subd.leaks());
    assert!(pubd.leaks().is_empty(), "leaked {:?}", pubd.leaks());
}

#[test]
fn the_pool_gate_is_refused_where_the_device_cannot_wait_and_checked_against_the_pool() {
    // A publisher whose device has no 64-bit stream memory operations keeps
    // no gate (and says so in the ring's flags).
    let mut old = FakeDevice::discrete(GPU);
    old.stream_waits = false;
    let oldd = FakeDriver::new(vec![old]);
    let mut p = pool(&oldd);
    assert!(!p.enable_gate_line(GATE).unwrap());
    assert!(p.enable_gate_line(4 * MIB - 8).is_err(), "a gate line past the pool");
    p.close().unwrap();

    let pubd = FakeDriver::with_one_gpu(GPU);
    let mut pool = pool(&pubd);
    assert!(pool.enable_gate_line(GATE).unwrap());
    // No MPS: `Auto` (only_mps) does not queue.
    let subd = subscriber_process(FakeDevice::discrete(GPU));
    let mut imp = import(&subd, &mut pool);
    assert!(!imp.enable_pool_gate(GATE, true).unwrap());
    // A gate word outside the pool, or misaligned, is a layout error.
    assert!(imp.enable_pool_gate(4 * MIB - 4, false).is_err());
    assert!(imp.enable_pool_gate(GATE + 4, false).is_err());
    assert!(!imp.gate_enabled());
    imp.close().unwrap();
    // A subscriber device without stream waits.
    let mut old = FakeDevice::discrete(GPU);
    old.stream_waits = false;
    let subd = subscriber_process(old);
    let mut imp = import(&subd, &mut pool);
    assert!(!imp.enable_pool_gate(GATE, false).unwrap());
    imp.close().unwrap();
    pool.close().unwrap();
}
