//! The CUDA backend's lifecycle on the fake driver (no GPU needed): every
//! driver call of create, import and close fails once in turn, and nothing
//! leaks, every release runs in the owning context, and the caller's context
//! (here a foreign one) is current again afterwards.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use vramring::seam::cuda::MappedTargets;
use vramring::seam::cuda::{code, CuContext, CuStream, CudaImport, CudaPool, DeviceSelector, Driver};
use vramring::seam::cuda::{ExportedPool, ImportedPool, OwnBuffer};
use vramring::Error;
use vramring::WriteCompletion;
use vramring_testkit::fake::{CallRecord, FakeDevice, FakeDriver};
use vramring_testkit::PatternKernels;

const GPU: [u8; 16] = *b"fake-gpu-0123456";
const OTHER: [u8; 16] = *b"other-gpu-abcdef";
const MIB: u64 = 1 << 20;

/// The publisher's fake process: one GPU.
fn publisher_process() -> Arc<FakeDriver> {
    FakeDriver::with_one_gpu(GPU)
}

/// A subscriber's fake process: the same GPU, seen as ordinal 1.
fn subscriber_process() -> Arc<FakeDriver> {
    FakeDriver::new(vec![FakeDevice::discrete(OTHER), FakeDevice::discrete(GPU)])
}

/// Makes a foreign context (another library's) current and returns it.
fn foreign_current(d: &FakeDriver) -> CuContext {
    let f = d.foreign_context();
    d.set_current(Some(f));
    f
}

fn assert_releases_in_owning_context(d: &FakeDriver, what: &str) {
    let releases = d.releases();
    let wrong: Vec<&CallRecord> = releases
        .iter()
        .filter(|r| matches!(r.owner, Some(Some(owner)) if r.current != Some(owner)))
        .collect();
    assert!(
        wrong.is_empty(),
        "{what}: releases outside their owning context: {wrong:#?}"
    );
}

fn assert_clean(d: &FakeDriver, foreign: CuContext, what: &str) {
    assert!(d.leaks().is_empty(), "{what}: leaked {:?}", d.leaks());
    assert_releases_in_owning_context(d, what);
    assert_eq!(
        d.current(),
        Some(foreign),
        "{what}: the caller's context is not current again"
    );
    assert_eq!(d.stack_depth(), 1, "{what}: the context stack was not restored");
}

fn create(d: &Arc<FakeDriver>, bytes: u64) -> vramring::Result<CudaPool<FakeDriver>> {
    CudaPool::create(Arc::clone(d), DeviceSelector::Uuid(GPU), bytes)
}

fn import(d: &Arc<FakeDriver>, fd: OwnedFd, bytes: u64, writable: bool) -> vramring::Result<CudaImport<FakeDriver>> {
    CudaImport::import(Arc::clone(d), fd, bytes, GPU, writable)
}

/// Calls `f` on a fresh driver to count the calls it makes.
fn calls_made(make: impl Fn() -> Arc<FakeDriver>, f: impl Fn(&Arc<FakeDriver>)) -> u64 {
    let d = make();
    let before = d.calls();
    f(&d);
    d.calls() - before
}

#[test]
fn a_pool_that_fails_at_any_driver_call_leaves_nothing_behind() {
    let total = calls_made(publisher_process, |d| std::mem::forget(create(d, 8 * MIB).unwrap()));
    assert!(total > 15, "create made only {total} calls");
    let mut failures = 0;
    for n in 1..=total {
        let d = publisher_process();
        let foreign = foreign_current(&d);
        d.fail_at(n);
        match create(&d, 8 * MIB) {
            Err(e) => {
                failures += 1;
                assert!(
                    matches!(
                        e,
                        Error::Driver {
                            code: code::UNKNOWN,
                            ..
                        }
                    ),
                    "call {n}: {e}"
                );
                assert_clean(&d, foreign, &format!("create failing at call {n}"));
                // The same process can try again and succeed.
                let mut p = create(&d, 8 * MIB).unwrap_or_else(|e| panic!("retry after call {n}: {e}"));
                p.close().unwrap();
            }
            // A failed context pop is retried once, so a fault there is absorbed.
            Ok(mut p) => {
                assert_eq!(
                    d.log()[n as usize - 1].call,
                    "cuCtxPopCurrent_v2",
                    "a fault at call {n} was lost"
                );
                p.close().unwrap();
            }
        }
        assert_clean(&d, foreign, &format!("create failing at call {n}, then retried"));
    }
    assert!(failures > total / 2, "only {failures} of {total} faults surfaced");
}

#[test]
fn an_import_that_fails_at_any_driver_call_leaves_nothing_behind() {
    let pubd = publisher_process();
    let pool = create(&pubd, 8 * MIB).unwrap();
    let bytes = pool.pool_bytes();
    let total = calls_made(subscriber_process, |d| {
        let imp = import(d, pool.export_fd().unwrap(), bytes, false).unwrap();
        std::mem::forget(imp);
    });
    assert!(total > 10, "import made only {total} calls");
    for n in 1..=total {
        let d = subscriber_process();
        let foreign = foreign_current(&d);
        d.fail_at(n);
        match import(&d, pool.export_fd().unwrap(), bytes, false) {
            Err(e) => {
                assert!(matches!(e, Error::Driver { .. }), "call {n}: {e}");
                assert_clean(&d, foreign, &format!("import failing at call {n}"));
                let mut imp = import(&d, pool.export_fd().unwrap(), bytes, false).unwrap();
                imp.close().unwrap();
            }
            Ok(mut imp) => imp.close().unwrap(),
        }
        assert_clean(&d, foreign, &format!("import failing at call {n}, then retried"));
    }
}

#[test]
fn a_pool_close_that_fails_at_any_call_succeeds_on_retry_and_frees_everything() {
    let close_calls = calls_made(publisher_process, |d| {
        let mut p = create(d, 4 * MIB).unwrap();
        let _ = foreign_current(d);
        p.close().unwrap();
    }) - calls_made(publisher_process, |d| std::mem::forget(create(d, 4 * MIB).unwrap()));
    assert!(close_calls >= 7, "close made only {close_calls} calls");
    let mut failed_closes = 0;
    for k in 1..=close_calls {
        let d = publisher_process();
        let mut p = create(&d, 4 * MIB).unwrap();
        let foreign = foreign_current(&d);
        d.fail_at(d.calls() + k);
        if let Err(e) = p.close() {
            failed_closes += 1;
            assert!(matches!(e, Error::Driver { .. }), "close call {k}: {e}");
            assert!(
                !d.leaks().is_empty(),
                "close call {k} failed but nothing is held for a retry"
            );
            assert_eq!(
                d.current(),
                Some(foreign),
                "close call {k}: caller's context not restored"
            );
            p.close().unwrap();
        }
        p.close().unwrap();
        assert_clean(&d, foreign, &format!("pool close failing at call {k}"));
    }
    assert!(
        failed_closes >= close_calls - 1,
        "only {failed_closes} of {close_calls} faults surfaced (one pop)"
    );
}

#[test]
fn an_import_close_that_fails_at_any_call_succeeds_on_retry_and_frees_everything() {
    let pubd = publisher_process();
    let pool = create(&pubd, 4 * MIB).unwrap();
    let bytes = pool.pool_bytes();
    let setup = |d: &Arc<FakeDriver>| {
        let mut imp = import(d, pool.export_fd().unwrap(), bytes, false).unwrap();
        imp.copy_out(0, MIB).unwrap();
        imp.complete().unwrap();
        imp
    };
    let close_calls = calls_made(subscriber_process, |d| {
        let mut imp = setup(d);
        imp.close().unwrap();
    }) - calls_made(subscriber_process, |d| std::mem::forget(setup(d)));
    assert!(close_calls >= 10, "close made only {close_calls} calls");
    for k in 1..=close_calls {
        let d = subscriber_process();
        let mut imp = setup(&d);
        let foreign = foreign_current(&d);
        d.fail_at(d.calls() + k);
        if let Err(e) = imp.close() {
            assert!(matches!(e, Error::Driver { .. }), "close call {k}: {e}");
            assert!(
                !d.leaks().is_empty(),
                "close call {k} failed but nothing is held for a retry"
            );
            imp.close().unwrap();
        }
        assert_clean(&d, foreign, &format!("import close failing at call {k}"));
    }
}

#[test]
fn every_release_runs_in_the_owning_context_even_under_a_foreign_one() {
    let pubd = publisher_process();
    let subd = subscriber_process();
    let mut pool = create(&pubd, 4 * MIB).unwrap();
    let mut imp = import(&subd, pool.export_fd().unwrap(), pool.pool_bytes(), false).unwrap();
    imp.copy_out(0, 3 * MIB).unwrap();
    let pub_foreign = foreign_current(&pubd);
    let sub_foreign = foreign_current(&subd);
    imp.close().unwrap();
    pool.close().unwrap();
    assert_clean(&pubd, pub_foreign, "publisher");
    assert_clean(&subd, sub_foreign, "subscriber");
    let released: Vec<&str> = subd.releases().iter().map(|r| r.call).collect();
    assert_eq!(
        released,
        [
            "cuStreamDestroy_v2",
            "cuMemUnmap",
            "cuMemAddressFree",
            "cuMemRelease",
            "cuMemFree_v2",
            "cuDevicePrimaryCtxRelease_v2"
        ],
        "teardown phases out of order"
    );
    let released: Vec<&str> = pubd.releases().iter().map(|r| r.call).collect();
    assert_eq!(
        released,
        [
            "cuMemUnmap",
            "cuMemAddressFree",
            "cuMemRelease",
            "cuDevicePrimaryCtxRelease_v2"
        ]
    );
}

#[test]
fn the_stream_is_idle_before_the_memory_it_reads_is_unmapped() {
    let pubd = publisher_process();
    let subd = subscriber_process();
    let pool = create(&pubd, 4 * MIB).unwrap();
    let mut imp = import(&subd, pool.export_fd().unwrap(), pool.pool_bytes(), false).unwrap();
    imp.copy_out(0, MIB).unwrap();
    let from = subd.log().len();
    imp.close().unwrap();
    let calls: Vec<&str> = subd.log()[from..].iter().map(|r| r.call).collect();
    let pos = |c: &str| calls.iter().position(|x| *x == c).unwrap();
    assert!(pos("cuStreamSynchronize") < pos("cuStreamDestroy_v2"));
    assert!(pos("cuStreamDestroy_v2") < pos("cuMemUnmap"));
    assert!(pos("cuMemUnmap") < pos("cuMemAddressFree"));
    assert!(pos("cuMemAddressFree") < pos("cuMemRelease"));
    assert_eq!(calls.last(), Some(&"cuDevicePrimaryCtxRelease_v2"));
}

#[test]
fn a_close_that_fails_mid_teardown_keeps_what_is_left_and_a_retry_finishes() {
    let d = publisher_process();
    let mut pool = create(&d, 4 * MIB).unwrap();
    d.fail_nth("cuMemAddressFree", 1);
    match pool.close() {
        Err(Error::Driver {
            call: "cuMemAddressFree",
            ..
        }) => {}
        other => panic!("expected cuMemAddressFree to fail, got {other:?}"),
    }
    let held = d.leaks();
    assert!(held.mappings.is_empty(), "the unmap that succeeded is not repeated");
    assert_eq!(held.reservations.len(), 1);
    assert_eq!(held.handles.len(), 1);
    assert_eq!(held.primary_contexts, [(0, 1)]);
    pool.close().unwrap();
    assert!(d.leaks().is_empty());
    let calls = d.calls();
    pool.close().unwrap();
    assert_eq!(d.calls(), calls, "a second close after success makes no driver calls");
    let unmaps = d.log().iter().filter(|r| r.call == "cuMemUnmap").count();
    assert_eq!(unmaps, 1);
}

#[test]
fn dropping_without_close_releases_everything() {
    let pubd = publisher_process();
    let subd = subscriber_process();
    let pool = create(&pubd, 4 * MIB).unwrap();
    let mut imp = import(&subd, pool.export_fd().unwrap(), pool.pool_bytes(), true).unwrap();
    imp.copy_out(MIB, MIB).unwrap();
    let mut k = PatternKernels::load(Arc::clone(&subd), 1).unwrap();
    k.close().unwrap();
    drop(imp);
    drop(pool);
    assert!(pubd.leaks().is_empty(), "{:?}", pubd.leaks());
    assert!(subd.leaks().is_empty(), "{:?}", subd.leaks());
    assert_releases_in_owning_context(&pubd, "publisher");
    assert_releases_in_owning_context(&subd, "subscriber");
}

#[test]
fn pattern_kernels_that_fail_to_load_leave_nothing_behind() {
    let total = calls_made(publisher_process, |d| {
        std::mem::forget(PatternKernels::load(Arc::clone(d), 0).unwrap())
    });
    for n in 1..=total {
        let d = publisher_process();
        let foreign = foreign_current(&d);
        d.fail_at(n);
        if let Ok(mut k) = PatternKernels::load(Arc::clone(&d), 0) {
            k.close().unwrap();
        }
        assert_clean(&d, foreign, &format!("kernel load failing at call {n}"));
    }
}

#[test]
fn a_frame_filled_by_the_publisher_arrives_whole_in_the_subscribers_own_buffer() {
    let pubd = publisher_process();
    let subd = subscriber_process();
    let pool = create(&pubd, 4 * MIB).unwrap();
    let fill = PatternKernels::load(Arc::clone(&pubd), 0).unwrap();
    let slot = MIB;
    let len = 3_110_400; // 1080p NV12
    let null = CuStream::from_bits(0);
    // SAFETY: the slot lies inside the pool's read-write mapping.
    unsafe { fill.fill(pool.base_addr() + slot, len, 42, null) }.unwrap();
    pool.complete_writes(WriteCompletion::CudaStream(null.as_raw()))
        .unwrap();

    let mut imp = import(&subd, pool.export_fd().unwrap(), pool.pool_bytes(), false).unwrap();
    imp.copy_out(slot, len).unwrap();
    imp.complete().unwrap();
    let check_k = PatternKernels::load(Arc::clone(&subd), imp.device()).unwrap();
    // SAFETY: the subscriber's own buffer holds `len` copied bytes.
    let check = unsafe { check_k.verify(imp.dest_addr(), len, imp.stream().unwrap()) }.unwrap();
    assert!(check.is_intact(42), "{check:?}");
    let mut host = vec![0u8; len as usize];
    // SAFETY: as above.
    unsafe { subd.memcpy_dtoh(&mut host, imp.dest_addr()) }.unwrap();
    vramring_testkit::pattern::verify(&host, 42).unwrap();
}

#[test]
fn a_frame_read_back_from_the_subscribers_own_device_buffer_is_whole_and_bounded() {
    let pubd = publisher_process();
    let subd = subscriber_process();
    let pool = create(&pubd, 4 * MIB).unwrap();
    let fill = PatternKernels::load(Arc::clone(&pubd), 0).unwrap();
    let len = 460_800; // 640x480 NV12
    let null = CuStream::from_bits(0);
    // SAFETY: the range lies inside the pool's read-write mapping.
    unsafe { fill.fill(pool.base_addr() + 2 * MIB, len, 7, null) }.unwrap();
    pool.complete_writes(WriteCompletion::CudaStream(null.as_raw()))
        .unwrap();
    let mut imp = import(&subd, pool.export_fd().unwrap(), pool.pool_bytes(), false).unwrap();
    let foreign = foreign_current(&subd);
    imp.copy_out(2 * MIB, len).unwrap();
    imp.complete().unwrap();
    let mut host = vec![0u8; len as usize];
    imp.read_own(OwnBuffer::Dest, &mut host).unwrap();
    vramring_testkit::pattern::verify(&host, 7).unwrap();
    assert_eq!(subd.current(), Some(foreign), "the caller's context is current again");
    // Past the subscriber's own buffer, or from push buffers it never made.
    let mut big = vec![0u8; (imp.dest_capacity() + 1) as usize];
    assert!(matches!(
        imp.read_own(OwnBuffer::Dest, &mut big),
        Err(Error::LayoutMismatch(_))
    ));
    assert!(imp.read_own(OwnBuffer::Push(0), &mut host[..16]).is_err());
    imp.close().unwrap();
    assert!(matches!(imp.read_own(OwnBuffer::Dest, &mut host), Err(Error::Closed)));
}

#[test]
fn a_read_only_import_cannot_write_the_pool_and_a_writable_one_can() {
    let pubd = publisher_process();
    let subd = subscriber_process();
    let pool = create(&pubd, 2 * MIB).unwrap();
    let ro = import(&subd, pool.export_fd().unwrap(), pool.pool_bytes(), false).unwrap();
    assert!(!ro.writable());
    // SAFETY: inside the import's mapping.
    match unsafe { subd.memset_d8(ro.base_addr(), 0xAB, 16) } {
        Err(e) => assert_eq!(e.code, code::ILLEGAL_ADDRESS),
        Ok(()) => panic!("a read-only mapping accepted a write"),
    }
    let rw = import(&subd, pool.export_fd().unwrap(), pool.pool_bytes(), true).unwrap();
    // SAFETY: inside the writable import's mapping.
    unsafe { subd.memset_d8(rw.base_addr(), 0xAB, 16) }.unwrap();
    let mut b = [0u8; 16];
    // SAFETY: inside the publisher's mapping.
    unsafe { pubd.memcpy_dtoh(&mut b, pool.base_addr()) }.unwrap();
    assert_eq!(b, [0xAB; 16], "the publisher sees the writable subscriber's bytes");
}

#[test]
fn an_import_on_a_machine_without_the_publishers_gpu_is_refused_by_uuid() {
    let pubd = publisher_process();
    let pool = create(&pubd, 2 * MIB).unwrap();
    let elsewhere = FakeDriver::with_one_gpu(OTHER);
    match import(&elsewhere, pool.export_fd().unwrap(), pool.pool_bytes(), false) {
        Err(Error::DeviceNotVisible { uuid }) => {
            assert!(uuid.starts_with("GPU-66616b65"), "{uuid}")
        }
        other => panic!("expected DeviceNotVisible, got {other:?}"),
    }
    assert!(elsewhere.leaks().is_empty());
}

#[test]
fn an_mps_server_without_room_for_this_process_is_named_and_explained() {
    let d = publisher_process();
    d.set_fail_code(808);
    d.fail_nth("cuDevicePrimaryCtxRetain", 1);
    let e = create(&d, 4 * MIB).expect_err("the context could not be had");
    assert!(matches!(e, Error::Driver { code: 808, .. }), "{e:?}");
    let text = e.to_string();
    for needle in [
        "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED",
        "fewer CUDA processes",
        "docs/MPS.md",
    ] {
        assert!(text.contains(needle), "{needle:?} missing from: {text}");
    }
    assert!(d.leaks().is_empty(), "leaked {:?}", d.leaks());
}

#[test]
fn a_pool_larger_than_free_memory_is_refused_before_allocating() {
    let mut dev = FakeDevice::discrete(GPU);
    dev.free = 64 * MIB;
    let d = FakeDriver::new(vec![dev]);
    match create(&d, 65 * MIB) {
        Err(Error::OutOfDeviceMemory { needed, free }) => {
            assert_eq!((needed, free), (66 * MIB, 64 * MIB))
        }
        other => panic!("expected OutOfDeviceMemory, got {other:?}"),
    }
    assert!(!d.log().iter().any(|r| r.call == "cuMemCreate"));
    assert!(d.leaks().is_empty());
}

#[test]
fn a_gpu_without_vmm_or_fd_export_is_refused_with_a_reason() {
    let mut dev = FakeDevice::discrete(GPU);
    dev.posix_fd = false;
    let d = FakeDriver::new(vec![dev]);
    match create(&d, MIB) {
        Err(Error::CudaUnavailable(why)) => {
            assert!(why.contains("POSIX file descriptors"), "{why}")
        }
        other => panic!("expected CudaUnavailable, got {other:?}"),
    }
    assert!(d.leaks().is_empty());
}

#[test]
fn the_pool_is_rounded_up_to_the_granularity_once() {
    let d = publisher_process();
    let pool = create(&d, 16 * 3_110_400).unwrap();
    assert_eq!(pool.pool_bytes(), 48 * MIB);
    assert_eq!(pool.granularity(), 2 * MIB);
    assert_eq!(d.log().iter().filter(|r| r.call == "cuMemCreate").count(), 1);
}

#[test]
fn publish_and_copy_leave_the_callers_context_current() {
    let pubd = publisher_process();
    let subd = subscriber_process();
    let pool = create(&pubd, 2 * MIB).unwrap();
    let mut imp = import(&subd, pool.export_fd().unwrap(), pool.pool_bytes(), false).unwrap();
    let pf = foreign_current(&pubd);
    let sf = foreign_current(&subd);
    pool.complete_writes(WriteCompletion::Host).unwrap();
    imp.copy_out(0, 4096).unwrap();
    imp.complete().unwrap();
    assert_eq!((pubd.current(), subd.current()), (Some(pf), Some(sf)));
    // With the pool's own context current, nothing is pushed or popped.
    pubd.set_current(Some(pool.context().unwrap()));
    let from = pubd.log().len();
    pool.complete_writes(WriteCompletion::Host).unwrap();
    assert!(pubd.log()[from..]
        .iter()
        .all(|r| r.call != "cuCtxPushCurrent_v2" && r.call != "cuCtxPopCurrent_v2"));
}

#[test]
fn a_copy_that_leaves_the_pool_or_a_closed_pool_is_an_error() {
    let pubd = publisher_process();
    let subd = subscriber_process();
    let mut pool = create(&pubd, 2 * MIB).unwrap();
    let mut imp = import(&subd, pool.export_fd().unwrap(), pool.pool_bytes(), false).unwrap();
    assert!(matches!(imp.copy_out(2 * MIB - 10, 11), Err(Error::LayoutMismatch(_))));
    assert!(matches!(imp.copy_out(u64::MAX, 2), Err(Error::LayoutMismatch(_))));
    imp.close().unwrap();
    assert!(matches!(imp.copy_out(0, 1), Err(Error::Closed)));
    pool.close().unwrap();
    assert!(matches!(pool.export_fd(), Err(Error::Closed)));
    assert_eq!(pool.base_addr(), 0);
}

/// A subscriber's push buffers (made in its process, exported) mapped by the
/// publisher (imported in its process): `n` at attach, the frame copy, and
/// the release of both sides.
fn push_round(pubd: &Arc<FakeDriver>, subd: &Arc<FakeDriver>) -> vramring::Result<()> {
    let mut pool = create(pubd, 8 * MIB)?;
    let mut imp = import(subd, pool.export_fd()?, pool.pool_bytes(), false)?;
    let stride = 2 * MIB;
    let (fd, bytes) = imp.alloc_push(3, stride)?;
    let id = pool.attach_target(&fd, bytes)?;
    drop(fd);
    // SAFETY: the first MiB of the pool's read-write mapping.
    unsafe { pubd.memset_d8(pool.base_addr(), 0x5A, MIB) }?;
    pool.push_copy(id, stride, 0, MIB, WriteCompletion::Host)?;
    pool.complete_writes(WriteCompletion::Host)?;
    let mut host = vec![0u8; MIB as usize];
    // SAFETY: push buffer 1 holds at least a MiB in the subscriber's process.
    unsafe { subd.memcpy_dtoh(&mut host, imp.push_addr(1)) }?;
    assert!(host.iter().all(|&b| b == 0x5A), "the pushed bytes did not arrive");
    pool.detach_target(id)?;
    imp.close()?;
    pool.close()?;
    Ok(())
}

#[test]
fn push_buffers_arrive_and_are_released_in_their_owning_contexts_in_both_processes() {
    let (pubd, subd) = (publisher_process(), subscriber_process());
    let (fp, fs) = (foreign_current(&pubd), foreign_current(&subd));
    push_round(&pubd, &subd).unwrap();
    assert_clean(&pubd, fp, "publisher after push");
    assert_clean(&subd, fs, "subscriber after push");
}

#[test]
fn releasing_a_push_target_whose_copies_landed_does_not_wait_for_the_context_and_detaching_does() {
    let (pubd, subd) = (publisher_process(), subscriber_process());
    let (fp, fs) = (foreign_current(&pubd), foreign_current(&subd));
    let mut pool = create(&pubd, 8 * MIB).unwrap();
    let mut imp = import(&subd, pool.export_fd().unwrap(), pool.pool_bytes(), false).unwrap();
    let (fd, bytes) = imp.alloc_push(3, 2 * MIB).unwrap();
    let syncs_during = |pool: &mut CudaPool<FakeDriver>,
                        f: fn(&mut CudaPool<FakeDriver>, u64) -> vramring::Result<()>| {
        let id = pool.attach_target(&fd, bytes).unwrap();
        let before = pubd.log().len();
        f(pool, id).unwrap();
        let log = pubd.log();
        let calls: Vec<&str> = log[before..].iter().map(|r| r.call).collect();
        assert!(calls.contains(&"cuMemUnmap"), "the target was not unmapped: {calls:?}");
        calls.iter().filter(|c| **c == "cuCtxSynchronize").count()
    };
    // The publisher saw the last copy's commit land: no wait, which would
    // include every other piece of work of the producer's context.
    assert_eq!(syncs_during(&mut pool, |p, id| p.release_target(id)), 0);
    // Nothing known about the copies: the context is waited for first.
    assert_eq!(syncs_during(&mut pool, |p, id| p.detach_target(id)), 1);
    drop(fd);
    imp.close().unwrap();
    pool.close().unwrap();
    assert_clean(&pubd, fp, "publisher after release and detach");
    assert_clean(&subd, fs, "subscriber after release and detach");
}

#[test]
fn a_mapper_maps_and_unmaps_push_buffers_on_another_thread_in_the_pools_context() {
    let (pubd, subd) = (publisher_process(), subscriber_process());
    let (fp, fs) = (foreign_current(&pubd), foreign_current(&subd));
    let mut pool = create(&pubd, 8 * MIB).unwrap();
    let mut imp = import(&subd, pool.export_fd().unwrap(), pool.pool_bytes(), false).unwrap();
    let stride = 2 * MIB;
    let (fd, bytes) = imp.alloc_push(3, stride).unwrap();
    let mapper = pool
        .target_mapper()
        .expect("a CUDA pool maps push buffers off the producer's thread");
    // The service thread of a publisher, with no context of its own current.
    let elsewhere = |f: &(dyn Fn() -> vramring::Result<()> + Sync)| {
        std::thread::scope(|s| s.spawn(f).join().expect("the mapping thread"))
    };
    let mapped = std::sync::Mutex::new(None);
    elsewhere(&|| {
        *mapped.lock().unwrap() = Some(mapper.map(&fd, bytes)?);
        Ok(())
    })
    .unwrap();
    let t = mapped.lock().unwrap().take().expect("mapped");
    assert_eq!(t.bytes(), bytes);
    let calls_before = pubd.log().len();
    // The producer takes it: no driver call.
    let id = pool.adopt_target(t).unwrap();
    assert_eq!(
        pubd.log().len(),
        calls_before,
        "adopting a mapped target called the driver"
    );
    // SAFETY: the first MiB of the pool's read-write mapping.
    unsafe { pubd.memset_d8(pool.base_addr(), 0x3C, MIB) }.unwrap();
    pool.push_copy(id, stride, 0, MIB, WriteCompletion::Host).unwrap();
    pool.complete_writes(WriteCompletion::Host).unwrap();
    let mut host = vec![0u8; MIB as usize];
    // SAFETY: push buffer 1 holds at least a MiB in the subscriber's process.
    unsafe { subd.memcpy_dtoh(&mut host, imp.push_addr(1)) }.unwrap();
    assert!(
        host.iter().all(|&b| b == 0x3C),
        "a copy into an adopted target did not arrive"
    );
    // Let go of by the producer, unmapped elsewhere, without a wait.
    let t = std::sync::Mutex::new(pool.disown_target(id).expect("the adopted target"));
    assert!(pool.disown_target(id).is_none(), "a target was disowned twice");
    let before = pubd.log().len();
    elsewhere(&|| mapper.unmap(&mut t.lock().unwrap())).unwrap();
    let calls: Vec<&str> = pubd.log()[before..].iter().map(|r| r.call).collect();
    assert!(calls.contains(&"cuMemUnmap"), "{calls:?}");
    assert!(
        !calls.contains(&"cuCtxSynchronize"),
        "the unmapping waited for the context: {calls:?}"
    );
    // After the pool's close the mapper refuses, rather than touch a
    // released context.
    drop(fd);
    imp.close().unwrap();
    pool.close().unwrap();
    let any: OwnedFd = std::fs::File::open("/dev/null").unwrap().into();
    let calls_before = pubd.log().len();
    assert!(matches!(mapper.map(&any, bytes), Err(Error::Closed)));
    assert_eq!(
        pubd.log().len(),
        calls_before,
        "a mapper of a closed pool called the driver"
    );
    assert_clean(&pubd, fp, "publisher after mapping elsewhere");
    assert_clean(&subd, fs, "subscriber after mapping elsewhere");
}

#[test]
fn a_push_attach_that_fails_at_any_driver_call_leaves_nothing_behind() {
    let total = calls_made(publisher_process, |d| push_round(d, &subscriber_process()).unwrap());
    let mut failures = 0;
    for n in 1..=total {
        let (pubd, subd) = (publisher_process(), subscriber_process());
        let (fp, fs) = (foreign_current(&pubd), foreign_current(&subd));
        pubd.fail_at(n);
        // A failure anywhere on the publisher's side: the error surfaces (or a
        // failed pop is absorbed); everything made is released by the drops.
        failures += u64::from(push_round(&pubd, &subd).is_err());
        assert_clean(&pubd, fp, &format!("publisher failing at call {n}"));
        assert_clean(&subd, fs, &format!("subscriber with a publisher failing at call {n}"));
    }
    assert!(
        failures > total / 2,
        "only {failures} of {total} publisher faults surfaced"
    );
    let total = calls_made(subscriber_process, |d| push_round(&publisher_process(), d).unwrap());
    let mut failures = 0;
    for n in 1..=total {
        let (pubd, subd) = (publisher_process(), subscriber_process());
        let (fp, fs) = (foreign_current(&pubd), foreign_current(&subd));
        subd.fail_at(n);
        failures += u64::from(push_round(&pubd, &subd).is_err());
        assert_clean(&pubd, fp, &format!("publisher with a subscriber failing at call {n}"));
        assert_clean(&subd, fs, &format!("subscriber failing at call {n}"));
    }
    assert!(
        failures > total / 2,
        "only {failures} of {total} subscriber faults surfaced"
    );
}
