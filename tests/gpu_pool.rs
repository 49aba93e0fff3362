//! The CUDA backend on a real GPU: export, import in this process and in a
//! child process, the GPU test pattern end to end, read-only enforcement, and
//! device memory returning after close.
//!
//! Run on a GPU machine with `cargo test --test gpu_pool -- --include-ignored`.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::Command;
use std::sync::Arc;

use vramring::seam::cuda::{
    free_memory_probe, ContextGuard, CuStream, CudaImport, CudaPool, DeviceSelector, Driver, RealDriver,
};
use vramring::seam::cuda::{ExportedPool, ImportedPool};
use vramring::WriteCompletion;
use vramring_testkit::PatternKernels;

const FRAME: u64 = 3_110_400; // 1080p NV12
const STRIDE: u64 = 3 << 20;
const SLOTS: u64 = 16;
const CHILD_MODE: &str = "VRAMRING_GPU_CHILD";

type R<T = ()> = Result<T, Box<dyn std::error::Error>>;

fn hex(b: &[u8; 16]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex uuid");
    }
    out
}

/// A non-blocking stream in `ctx`, made and later destroyed with it pushed.
struct TestStream {
    d: Arc<RealDriver>,
    ctx: vramring::seam::cuda::CuContext,
    s: CuStream,
}

impl TestStream {
    fn new(d: &Arc<RealDriver>, ctx: vramring::seam::cuda::CuContext) -> R<Self> {
        // SAFETY: `ctx` is retained by the pool or import the caller holds.
        let g = unsafe { ContextGuard::push(&**d, ctx) }?;
        let s = d.stream_create_non_blocking()?;
        g.restore()?;
        Ok(TestStream {
            d: Arc::clone(d),
            ctx,
            s,
        })
    }
}

impl Drop for TestStream {
    fn drop(&mut self) {
        // SAFETY: as in `new`; the stream is ours and live.
        if let Ok(g) = unsafe { ContextGuard::push(&*self.d, self.ctx) } {
            // SAFETY: our live stream.
            let _ = unsafe { self.d.stream_synchronize(self.s) };
            // SAFETY: our live stream, idle.
            let _ = unsafe { self.d.stream_destroy(self.s) };
            let _ = g.restore();
        }
    }
}

fn fill_slots(pool: &CudaPool, k: &PatternKernels<RealDriver>, s: CuStream, first_seq: u64) -> R {
    for i in 0..SLOTS {
        // SAFETY: slot `i` lies inside the pool's read-write mapping.
        unsafe { k.fill(pool.device_ptr() + i * STRIDE, FRAME, first_seq + i, s) }?;
    }
    pool.complete_writes(WriteCompletion::CudaStream(s.as_raw()))?;
    Ok(())
}

fn check_slots(imp: &mut CudaImport, k: &PatternKernels<RealDriver>, first_seq: u64) -> R {
    for i in 0..SLOTS {
        imp.copy_out(i * STRIDE, FRAME)?;
        imp.complete()?;
        // SAFETY: the import's own buffer holds FRAME copied bytes.
        let c = unsafe { k.verify(imp.dest_addr(), FRAME, imp.stream()?) }?;
        assert!(c.is_intact(first_seq + i), "slot {i}: {c:?}");
    }
    Ok(())
}

fn pool() -> R<(Arc<RealDriver>, CudaPool, PatternKernels<RealDriver>, TestStream)> {
    let d = RealDriver::shared()?;
    let pool = CudaPool::create(Arc::clone(&d), DeviceSelector::Ordinal(0), SLOTS * STRIDE)?;
    let k = PatternKernels::load(Arc::clone(&d), pool.device())?;
    let s = TestStream::new(&d, pool.context()?)?;
    Ok((d, pool, k, s))
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_pool_filled_on_the_gpu_is_read_whole_through_an_import_in_this_process() -> R {
    let (d, mut pool, k, s) = pool()?;
    fill_slots(&pool, &k, s.s, 1000)?;
    let mut imp = CudaImport::import(
        Arc::clone(&d),
        pool.export_fd()?,
        pool.pool_bytes(),
        pool.device_uuid(),
        false,
    )?;
    check_slots(&mut imp, &k, 1000)?;
    let mut host = vec![0u8; FRAME as usize];
    imp.copy_out(5 * STRIDE, FRAME)?;
    imp.complete()?;
    // SAFETY: the import retains its context while open.
    let g = unsafe { ContextGuard::push(&*d, imp.context()?) }?;
    // SAFETY: the import's own buffer holds FRAME bytes; its stream is idle;
    // its context is current (pushed above).
    let copied = unsafe { d.memcpy_dtoh(&mut host, imp.dest_addr()) };
    g.restore()?;
    copied?;
    vramring_testkit::pattern::verify(&host, 1005)?;
    imp.close()?;
    drop(s);
    drop(k);
    pool.close()?;
    Ok(())
}

fn spawn_child(mode: &str, pool: &CudaPool) -> R<std::process::ExitStatus> {
    let fd = pool.export_fd()?;
    // The child inherits this one descriptor: clear close-on-exec on it.
    rustix::io::fcntl_setfd(&fd, rustix::io::FdFlags::empty())?;
    let status = Command::new(std::env::current_exe()?)
        .args([
            "--exact",
            "child_process_entry",
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_MODE, mode)
        .env("VRAMRING_CHILD_FD", fd.as_raw_fd().to_string())
        .env("VRAMRING_CHILD_BYTES", pool.pool_bytes().to_string())
        .env("VRAMRING_CHILD_UUID", hex(&pool.device_uuid()))
        .status()?;
    drop(fd);
    Ok(status)
}

/// Exit code of a child whose write through a read-only mapping went through.
const WROTE_THROUGH_READ_ONLY: i32 = 42;

/// Not a test on its own: the body of the child processes the tests spawn.
#[test]
#[ignore = "needs a CUDA GPU"]
fn child_process_entry() -> R {
    let Ok(mode) = std::env::var(CHILD_MODE) else {
        return Ok(());
    };
    let raw: i32 = std::env::var("VRAMRING_CHILD_FD")?.parse()?;
    // SAFETY: the parent passed this descriptor, open and inherited, for us
    // alone; nothing else in this process owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let bytes: u64 = std::env::var("VRAMRING_CHILD_BYTES")?.parse()?;
    let uuid = unhex(&std::env::var("VRAMRING_CHILD_UUID")?);
    let d = RealDriver::shared()?;
    let mut imp = CudaImport::import(Arc::clone(&d), fd, bytes, uuid, false)?;
    match mode.as_str() {
        "read" => {
            let k = PatternKernels::load(Arc::clone(&d), imp.device())?;
            check_slots(&mut imp, &k, 1000)?;
            Ok(())
        }
        "write_ro" => {
            let ctx = imp.context()?;
            // SAFETY: the import retains `ctx`.
            let g = unsafe { ContextGuard::push(&*d, ctx) }?;
            // SAFETY: inside the import's (read-only) mapping: the driver or
            // the GPU must refuse the write.
            let r = unsafe { d.memset_d8(imp.base_addr(), 0xEE, 4096) };
            let r = r.and_then(|()| d.ctx_synchronize());
            eprintln!("write through the read-only mapping: {r:?}");
            drop(g);
            if r.is_ok() {
                std::process::exit(WROTE_THROUGH_READ_ONLY);
            }
            // The context may be unusable now; leave without tearing down.
            std::process::exit(0);
        }
        other => Err(format!("unknown child mode {other}").into()),
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_child_process_imports_the_pool_by_inherited_fd_and_reads_every_frame_whole() -> R {
    let (_d, mut pool, k, s) = pool()?;
    fill_slots(&pool, &k, s.s, 1000)?;
    let status = spawn_child("read", &pool)?;
    assert!(status.success(), "child failed: {status}");
    drop(s);
    drop(k);
    pool.close()?;
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_write_through_a_read_only_import_fails_in_its_process_and_the_producer_carries_on() -> R {
    let (d, mut pool, k, s) = pool()?;
    fill_slots(&pool, &k, s.s, 1000)?;
    let status = spawn_child("write_ro", &pool)?;
    assert_ne!(
        status.code(),
        Some(WROTE_THROUGH_READ_ONLY),
        "a read-only import wrote into the pool"
    );
    // The producer's pool is untouched and still usable.
    let mut imp = CudaImport::import(
        Arc::clone(&d),
        pool.export_fd()?,
        pool.pool_bytes(),
        pool.device_uuid(),
        false,
    )?;
    check_slots(&mut imp, &k, 1000)?;
    fill_slots(&pool, &k, s.s, 2000)?;
    check_slots(&mut imp, &k, 2000)?;
    imp.close()?;
    drop(s);
    drop(k);
    pool.close()?;
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn device_free_memory_returns_to_where_it_started_after_close() -> R {
    let d = RealDriver::shared()?;
    // The probe holds a context reference, so context creation is not counted.
    let mut free = free_memory_probe(Arc::clone(&d), 0)?;
    let before = free().ok_or("cuMemGetInfo failed")?;
    let mut pool = CudaPool::create(Arc::clone(&d), DeviceSelector::Ordinal(0), 256 << 20)?;
    let mut imp = CudaImport::import(
        Arc::clone(&d),
        pool.export_fd()?,
        pool.pool_bytes(),
        pool.device_uuid(),
        false,
    )?;
    imp.copy_out(0, 64 << 20)?;
    imp.complete()?;
    let during = free().ok_or("cuMemGetInfo failed")?;
    assert!(
        before.saturating_sub(during) >= 256 << 20,
        "the pool did not show in free memory: {before} -> {during}"
    );
    imp.close()?;
    pool.close()?;
    let after = free().ok_or("cuMemGetInfo failed")?;
    let slack = 4 << 20;
    assert!(
        after + slack >= before,
        "free memory {before} before, {after} after close"
    );
    eprintln!("free device memory: {before} before, {during} with the pool, {after} after close");
    Ok(())
}
