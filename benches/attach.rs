//! What a push subscriber's arrival and departure cost the thread that maps
//! its buffers on a CUDA ring (ADR 0018: the publisher's service thread):
//! mapping them (`ExportedPool::attach_target`:
//! `cuMemImportFromShareableHandle`, reserve, map, set access) and unmapping
//! them, without synchronising (`release_target`) and with a
//! `cuCtxSynchronize` first (`detach_target`, here on an idle context: with
//! GPU work queued it waits for all of it).
//!
//! 1080p NV12 push buffers (3 × 3.1 MB, one allocation), exported by a
//! push-only import as a subscriber's are: made in a child process and
//! sent over a socket, as a real subscriber's are ("another process"), and
//! made in this process ("this process"). Each row maps the same
//! allocation over and over; a real newcomer brings one the driver has not
//! imported yet, which costs more (ADR 0018 has both figures).
//! Run on a GPU machine: `cargo bench --bench attach` (staged:
//! `bash .device/run.sh bench attach`).

use std::sync::Arc;
use std::time::Instant;

use vramring::seam::cuda::{CudaImport, CudaPool, DeviceSelector, RealDriver};
use vramring::seam::cuda::{ExportedPool, ImportedPool};

use common::{output, pct_us, procs, R};
use vramring_benches as common;

const ROUNDS: usize = 300;
/// 1080p NV12, rounded up to the crate's slot alignment as push strides are.
const STRIDE: u64 = (1920 * 1080 * 3 / 2u64).next_multiple_of(vramring::seam::format::SLOT_ALIGN);

/// Environment variable naming the child's socket descriptor.
const CHILD_ENV: &str = "VRAMRING_ATTACH_BENCH_SOCKET";

/// The child: makes the push buffers, sends their descriptor, and keeps
/// them until the parent hangs up.
fn child(sock: std::os::fd::OwnedFd, uuid: [u8; 16]) -> R<()> {
    use std::os::fd::AsFd;
    let mut sub = CudaImport::push_only(RealDriver::shared()?, uuid)?;
    let (fd, _) = sub.alloc_push(vramring::seam::layout::PUSH_BUFFERS as u32, STRIDE)?;
    vramring::seam::socket::transport::send(sock.as_fd(), b"push", &[fd.as_fd()])?;
    drop(fd);
    // Until the parent closes its end.
    let _ = vramring::seam::socket::transport::recv(sock.as_fd(), std::time::Duration::from_secs(600));
    sub.close()?;
    Ok(())
}

/// Push buffers made by a child process: the descriptor, the child and
/// the socket that keeps it waiting.
fn from_child(uuid: [u8; 16]) -> R<(std::os::fd::OwnedFd, std::process::Child, std::os::fd::OwnedFd)> {
    use rustix::net::{socketpair, AddressFamily, SocketFlags, SocketType};
    use std::os::fd::{AsFd, AsRawFd};
    let (ours, theirs) = socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)?;
    rustix::io::fcntl_setfd(&theirs, rustix::io::FdFlags::empty())?;
    let child = procs::self_command(std::iter::empty::<&str>())?
        .env(CHILD_ENV, format!("{} {}", theirs.as_raw_fd(), procs::hex(&uuid)))
        .spawn()?;
    drop(theirs);
    let got = vramring::seam::socket::transport::recv(ours.as_fd(), std::time::Duration::from_secs(30))?
        .ok_or("the child sent no push buffers")?;
    let fd = got
        .fds
        .into_iter()
        .next()
        .ok_or("the child's message had no descriptor")?
        .into_owned();
    Ok((fd, child, ours))
}

fn main() -> R<()> {
    let usage = format!(
        "attach bench: maps and unmaps a 1080p push subscriber's buffers {ROUNDS} times per row; needs a CUDA GPU"
    );
    if output::help(&output::args(), &usage) {
        return Ok(());
    }
    if let Ok(v) = std::env::var(CHILD_ENV) {
        use std::os::fd::FromRawFd;
        let (fd, hex) = v.split_once(' ').ok_or("bad child arguments")?;
        let uuid: [u8; 16] = procs::unhex(hex)?.try_into().map_err(|_| "bad uuid")?;
        // SAFETY: the parent made this descriptor inheritable for us and
        // named it; nothing else in this process owns it.
        let sock = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd.parse()?) };
        return child(sock, uuid);
    }
    let d = RealDriver::shared()?;
    let mut pool = CudaPool::create(Arc::clone(&d), DeviceSelector::Ordinal(0), 64 << 20)?;
    let uuid = pool.device_uuid();
    let (remote_fd, mut remote, hangup) = from_child(uuid)?;
    let mut sub = CudaImport::push_only(Arc::clone(&d), uuid)?;
    let (local_fd, bytes) = sub.alloc_push(vramring::seam::layout::PUSH_BUFFERS as u32, STRIDE)?;
    let mut rows = Vec::new();
    for (made, fd) in [("another process", &remote_fd), ("this process", &local_fd)] {
        for (how, sync) in [
            ("release (no synchronisation)", false),
            ("detach (cuCtxSynchronize first)", true),
        ] {
            let (mut map, mut unmap) = (Vec::with_capacity(ROUNDS), Vec::with_capacity(ROUNDS));
            for _ in 0..ROUNDS {
                let t0 = Instant::now();
                let id = pool.attach_target(fd, bytes)?;
                let t1 = Instant::now();
                if sync {
                    pool.detach_target(id)?;
                } else {
                    pool.release_target(id)?;
                }
                map.push((t1 - t0).as_nanos() as u64);
                unmap.push(t1.elapsed().as_nanos() as u64);
            }
            map.sort_unstable();
            unmap.sort_unstable();
            rows.push((made, how, map, unmap));
        }
    }
    println!(
        "Push buffers of {bytes} bytes (3 × {STRIDE}), mapped and unmapped {ROUNDS} times per row, wall time of the mapping thread (µs):\n"
    );
    print!(
        "{}",
        output::table_header("buffers made in | unmapping | map p50 | map p99 | unmap p50 | unmap p99")
    );
    for (made, how, map, unmap) in &rows {
        println!(
            "| {made} | {how} | {:.1} | {:.1} | {:.1} | {:.1} |",
            pct_us(map, 0.5),
            pct_us(map, 0.99),
            pct_us(unmap, 0.5),
            pct_us(unmap, 0.99)
        );
    }
    drop((remote_fd, local_fd, hangup));
    remote.wait()?;
    sub.close()?;
    pool.close()?;
    Ok(())
}
