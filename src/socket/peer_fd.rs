//! [`PeerFd`]: a descriptor received from a peer, closed where its close
//! cannot hold the thread that drops it.
//!
//! A subscriber may send any descriptor it can open, and `close` is not
//! always quick: the last close of a file on a filesystem a process serves
//! (FUSE) waits for that process's answer to its flush, a network file
//! flushes over the network, a serial TTY drains its output. The
//! publisher's service and producer threads drop the descriptors peers
//! send, so such a close would stall every subscriber. A `PeerFd` is closed
//! on the dropping thread only when its kind cannot block: a socket (its
//! linger is zeroed when it is wrapped), a pipe, a file of
//! tmpfs or hugetlbfs (a memfd), an anonymous inode. Any other goes to one
//! process-wide closer thread, which may block in its place; its queue is
//! bounded only by the descriptors the process may hold (docs/SECURITY.md).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Mutex, OnceLock};

/// Descriptors the closer thread has closed (for tests and diagnostics).
static CLOSED_ELSEWHERE: AtomicU64 = AtomicU64::new(0);

/// How many peers' descriptors the closer thread has closed in this process.
pub fn closed_elsewhere() -> u64 {
    // Relaxed: a counter.
    CLOSED_ELSEWHERE.load(Ordering::Relaxed)
}

/// `statfs` magic numbers of the filesystems whose files close without
/// waiting for anyone (`linux/magic.h`).
const TMPFS_MAGIC: u64 = 0x0102_1994;
const HUGETLBFS_MAGIC: u64 = 0x9584_58f6;
const ANON_INODE_FS_MAGIC: u64 = 0x0904_1934;

/// A descriptor a peer sent. Dropping it closes it here when that cannot
/// block, else on the closer thread.
#[derive(Debug)]
pub struct PeerFd(Option<OwnedFd>);

impl PeerFd {
    /// Wraps a descriptor received from a peer. A socket gets a zero
    /// `SO_LINGER`: one the peer set to linger with unsent data would
    /// otherwise hold whichever thread closes it for the linger time; a
    /// zero linger turns that close into an immediate reset. (`ENOTSOCK`
    /// for anything else is ignored.)
    pub fn new(fd: OwnedFd) -> PeerFd {
        let _ = rustix::net::sockopt::set_socket_linger(&fd, Some(std::time::Duration::ZERO));
        PeerFd(Some(fd))
    }

    /// The descriptor, for a caller that trusts its peer (a subscriber
    /// receiving the publisher's regions) or keeps it for good.
    pub fn into_owned(mut self) -> OwnedFd {
        match self.0.take() {
            Some(fd) => fd,
            // Only `drop` takes it otherwise.
            None => unreachable!("a PeerFd holds its descriptor until dropped"),
        }
    }

    fn owned(&self) -> &OwnedFd {
        match &self.0 {
            Some(fd) => fd,
            None => unreachable!("a PeerFd holds its descriptor until dropped"),
        }
    }
}

impl AsFd for PeerFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.owned().as_fd()
    }
}

impl std::ops::Deref for PeerFd {
    type Target = OwnedFd;
    fn deref(&self) -> &OwnedFd {
        self.owned()
    }
}

impl Drop for PeerFd {
    fn drop(&mut self) {
        if let Some(fd) = self.0.take() {
            if closes_at_once(fd.as_fd()) {
                drop(fd);
            } else {
                close_elsewhere(fd);
            }
        }
    }
}

/// Whether closing `fd` cannot wait on anyone (see the module docs). When
/// in doubt, `false`.
pub(crate) fn closes_at_once(fd: BorrowedFd<'_>) -> bool {
    use rustix::fs::FileType;
    let Ok(st) = rustix::fs::fstat(fd) else {
        return false;
    };
    match FileType::from_raw_mode(st.st_mode) {
        // A socket's linger was zeroed by `PeerFd::new`.
        FileType::Socket | FileType::Fifo => true,
        FileType::RegularFile | FileType::Unknown => rustix::fs::fstatfs(fd)
            .is_ok_and(|fs| matches!(fs.f_type as u64, TMPFS_MAGIC | HUGETLBFS_MAGIC | ANON_INODE_FS_MAGIC)),
        _ => false,
    }
}

/// Hands `fd` to the closer thread (started on first use); closes it here
/// if the thread cannot be started.
fn close_elsewhere(fd: OwnedFd) {
    static CLOSER: OnceLock<Option<Mutex<Sender<OwnedFd>>>> = OnceLock::new();
    let closer = CLOSER.get_or_init(|| {
        let (tx, rx) = channel::<OwnedFd>();
        let spawned = std::thread::Builder::new()
            .name("vramring-closer".into())
            .spawn(move || {
                // Ends when every sender is gone (never, the sender is
                // static); the process exits without joining it.
                for fd in rx {
                    drop(fd);
                    // Relaxed: a counter.
                    CLOSED_ELSEWHERE.fetch_add(1, Ordering::Relaxed);
                }
            });
        match spawned {
            Ok(_) => Some(Mutex::new(tx)),
            Err(e) => {
                tracing::warn!(error = %e, "no closer thread; peers' descriptors are closed where they are dropped");
                None
            }
        }
    });
    let fd = match closer {
        Some(tx) => match tx.lock() {
            Ok(tx) => match tx.send(fd) {
                Ok(()) => return,
                Err(e) => e.0,
            },
            Err(_) => fd,
        },
        None => fd,
    };
    drop(fd);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::time::{Duration, Instant};

    #[test]
    fn memfds_sockets_pipes_and_eventfds_close_at_once_and_other_files_do_not() {
        let memfd = rustix::fs::memfd_create("peer-fd-test", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        assert!(closes_at_once(memfd.as_fd()), "a memfd");
        let (a, _b) = rustix::net::socketpair(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::SEQPACKET,
            rustix::net::SocketFlags::CLOEXEC,
            None,
        )
        .unwrap();
        assert!(closes_at_once(a.as_fd()), "a socket");
        let (r, _w) = rustix::pipe::pipe().unwrap();
        assert!(closes_at_once(r.as_fd()), "a pipe");
        let ev = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).unwrap();
        assert!(closes_at_once(ev.as_fd()), "an eventfd");
        // A character device (a TTY's close may drain its output) and a
        // file of the source tree's filesystem (not tmpfs in any build
        // this crate knows; FUSE and NFS look the same from here).
        let null = std::fs::File::open("/dev/null").unwrap();
        assert!(!closes_at_once(null.as_fd()), "a character device");
        let src = std::fs::File::open(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml")).unwrap();
        let on_tmpfs = rustix::fs::fstatfs(&src).is_ok_and(|fs| fs.f_type as u64 == TMPFS_MAGIC);
        assert_eq!(closes_at_once(src.as_fd()), on_tmpfs, "a file of the source tree");
    }

    /// Whether descriptor number `n` still names the file with `ino`.
    fn still_open(n: i32, ino: u64) -> bool {
        std::fs::metadata(format!("/proc/self/fd/{n}")).is_ok_and(|m| std::os::unix::fs::MetadataExt::ino(&m) == ino)
    }

    #[test]
    fn a_descriptor_whose_close_may_block_is_closed_on_the_closer_thread() {
        // /dev/zero: no other test of this crate opens it, so its number
        // is not reused for the same file while we watch.
        let f = std::fs::File::open("/dev/zero").unwrap();
        let (n, ino) = (f.as_raw_fd(), rustix::fs::fstat(&f).unwrap().st_ino);
        let before = closed_elsewhere();
        drop(PeerFd::new(f.into()));
        let t = Instant::now();
        while still_open(n, ino) || closed_elsewhere() == before {
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "the closer thread never closed it"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        // And one that closes at once is closed by the drop itself.
        let memfd = rustix::fs::memfd_create("peer-fd-test", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        let (n, ino) = (memfd.as_raw_fd(), rustix::fs::fstat(&memfd).unwrap().st_ino);
        drop(PeerFd::new(memfd));
        assert!(!still_open(n, ino), "a memfd was not closed by its drop");
    }
}
