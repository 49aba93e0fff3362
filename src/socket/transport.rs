//! `SOCK_SEQPACKET` path sockets: bind with a liveness lock, connect,
//! datagrams with descriptors by `SCM_RIGHTS`, peer credentials.

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::event::{PollFd, PollFlags};
use rustix::fs::{FlockOperation, Mode, OFlags};
use rustix::io::Errno;
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};

use crate::error::{Error, IoContext, Result};
use crate::socket::msg::MAX_MSG_BYTES;
use crate::socket::peer_fd::PeerFd;

/// Most descriptors one message carries.
pub const MAX_FDS: usize = 4;

/// Who may connect: an allow-list of uids and gids checked against
/// `SO_PEERCRED`. Empty lists allow everyone the socket's file mode lets in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AccessPolicy {
    /// Allowed uids.
    pub uids: Vec<u32>,
    /// Allowed gids.
    pub gids: Vec<u32>,
}

impl AccessPolicy {
    /// Whether a peer with `uid`/`gid` may subscribe. The peer's pid is never
    /// looked at: pids differ per namespace.
    pub fn allows(&self, uid: u32, gid: u32) -> bool {
        (self.uids.is_empty() && self.gids.is_empty()) || self.uids.contains(&uid) || self.gids.contains(&gid)
    }
}

/// A listening socket at a path, owned by the process holding `<path>.lock`.
///
/// Ownership rule: the process that holds the exclusive `flock` on the lock
/// file owns the socket path: it may replace a stale socket file and it
/// unlinks the path when it is dropped. The lock file itself is never
/// unlinked (unlinking a lock file races with its next taker).
#[derive(Debug)]
pub struct Listener {
    fd: OwnedFd,
    path: PathBuf,
    _lock: OwnedFd,
}

fn lock_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".lock");
    PathBuf::from(p)
}

impl Listener {
    /// Binds a `SOCK_SEQPACKET` socket at `path` with file mode `mode`.
    ///
    /// # Errors
    /// [`Error::AddressInUse`] when a live publisher owns the path;
    /// [`Error::Io`] for OS failures, or when `path` exists and is not a socket.
    pub fn bind(path: &Path, mode: u32) -> Result<Listener> {
        let lp = lock_path(path);
        let lock = rustix::fs::open(
            &lp,
            OFlags::CREATE | OFlags::RDWR | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .ctx(|| format!("opening lock file {}", lp.display()))?;
        match rustix::fs::flock(&lock, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(Errno::WOULDBLOCK) => return Err(Error::AddressInUse(path.to_owned())),
            Err(e) => return Err(Error::io(format!("flock {}", lp.display()), e)),
        }
        // We own the path. A socket file left there is stale (its owner died
        // without unlinking it) unless something not using our lock listens.
        match rustix::fs::lstat(path) {
            Ok(st) => {
                if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::Socket {
                    return Err(Error::io(
                        format!("{} exists and is not a socket; refusing to replace it", path.display()),
                        Errno::EXIST,
                    ));
                }
                if probe_live(path) {
                    return Err(Error::AddressInUse(path.to_owned()));
                }
                rustix::fs::unlink(path).ctx(|| format!("removing stale socket {}", path.display()))?;
            }
            Err(Errno::NOENT) => {}
            Err(e) => return Err(Error::io(format!("lstat {}", path.display()), e)),
        }
        let fd = seqpacket()?;
        let addr = SocketAddrUnix::new(path).ctx(|| format!("socket path {}", path.display()))?;
        rustix::net::bind(&fd, &addr).ctx(|| format!("bind {}", path.display()))?;
        rustix::fs::chmod(path, Mode::from_raw_mode(mode)).ctx(|| format!("chmod {:o} {}", mode, path.display()))?;
        rustix::net::listen(&fd, 64).ctx(|| format!("listen {}", path.display()))?;
        Ok(Listener {
            fd,
            path: path.to_owned(),
            _lock: lock,
        })
    }

    /// Accepts one pending connection, waiting at most `timeout`.
    pub fn accept(&self, timeout: Duration) -> Result<Option<OwnedFd>> {
        if !readable(self.fd.as_fd(), timeout)? {
            return Ok(None);
        }
        match rustix::net::accept_with(&self.fd, SocketFlags::CLOEXEC) {
            Ok(fd) => Ok(Some(fd)),
            Err(Errno::AGAIN) | Err(Errno::INTR) | Err(Errno::CONNABORTED) => Ok(None),
            Err(e) => Err(Error::io("accept", e)),
        }
    }

    /// The listening descriptor (for polling).
    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        // We hold the lock, so the path is ours to remove.
        if let Err(e) = rustix::fs::unlink(&self.path) {
            if e != Errno::NOENT {
                tracing::warn!(path = %self.path.display(), error = %e, "could not unlink the socket");
            }
        }
    }
}

/// Whether something listens at `path` (a full backlog, `EAGAIN` after the
/// timeout, is a listener too: a busy or frozen publisher still owns it).
fn probe_live(path: &Path) -> bool {
    matches!(connect_once(path, CONNECT_TIMEOUT), Ok(_) | Err(Errno::AGAIN))
}

fn seqpacket() -> Result<OwnedFd> {
    rustix::net::socket_with(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)
        .ctx(|| "socket(AF_UNIX, SOCK_SEQPACKET)".into())
}

/// How long a connect (and each later send) may wait when no other bound
/// is given: a Unix `connect` otherwise blocks for good once a publisher
/// that stopped accepting has a full backlog.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

fn connect_once(path: &Path, timeout: Duration) -> std::result::Result<OwnedFd, Errno> {
    let fd = rustix::net::socket_with(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)?;
    // SO_SNDTIMEO bounds a Unix connect that waits for backlog room (and
    // every send on the socket); the kernel then fails with EAGAIN.
    rustix::net::sockopt::set_socket_timeout(
        &fd,
        rustix::net::sockopt::Timeout::Send,
        Some(timeout.max(Duration::from_millis(1))),
    )?;
    let addr = SocketAddrUnix::new(path)?;
    rustix::net::connect(&fd, &addr)?;
    Ok(fd)
}

/// Connects to the publisher socket at `path`, waiting at most
/// [`CONNECT_TIMEOUT`] for room in its backlog.
///
/// # Errors
/// As [`connect_within`].
pub fn connect(path: &Path) -> Result<OwnedFd> {
    connect_within(path, CONNECT_TIMEOUT)
}

/// Connects to the publisher socket at `path`, waiting at most `timeout`
/// when its backlog is full (a publisher that stopped accepting).
///
/// # Errors
/// [`Error::Io`] with the path when nothing listens there;
/// [`Error::Timeout`] when the publisher did not take the connection in time.
pub fn connect_within(path: &Path, timeout: Duration) -> Result<OwnedFd> {
    match connect_once(path, timeout) {
        Err(Errno::AGAIN) => Err(Error::Timeout(timeout, "room in the publisher's connection backlog")),
        other => other.ctx(|| format!("connecting to publisher socket {}", path.display())),
    }
}

/// Waits until `fd` is readable (or hung up), at most `timeout`.
pub fn readable(fd: BorrowedFd<'_>, timeout: Duration) -> Result<bool> {
    let mut fds = [PollFd::from_borrowed_fd(fd, PollFlags::IN)];
    let ts = crate::time::timespec(timeout);
    match rustix::event::poll(&mut fds, Some(&ts)) {
        Ok(n) => Ok(n > 0),
        Err(Errno::INTR) => Ok(false),
        Err(e) => Err(Error::io("poll", e)),
    }
}

/// Whether the peer of a connected socket hung up (without consuming data).
pub fn peer_closed(fd: BorrowedFd<'_>) -> bool {
    let mut fds = [PollFd::from_borrowed_fd(fd, PollFlags::IN | PollFlags::RDHUP)];
    let ts = rustix::time::Timespec { tv_sec: 0, tv_nsec: 0 };
    match rustix::event::poll(&mut fds, Some(&ts)) {
        Ok(0) => false,
        Ok(_) => {
            let r = fds[0].revents();
            r.intersects(PollFlags::HUP | PollFlags::RDHUP | PollFlags::ERR)
        }
        Err(_) => false,
    }
}

/// Sends one datagram with `fds` attached.
pub fn send(fd: BorrowedFd<'_>, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> Result<()> {
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && (fds.len() > MAX_FDS || !control.push(SendAncillaryMessage::ScmRights(fds))) {
        return Err(Error::Config(format!("cannot attach {} descriptors", fds.len())));
    }
    let iov = [IoSlice::new(bytes)];
    let n = rustix::net::sendmsg(fd, &iov, &mut control, SendFlags::NOSIGNAL).ctx(|| "sendmsg".into())?;
    if n != bytes.len() {
        return Err(Error::io("sendmsg", Errno::MSGSIZE));
    }
    Ok(())
}

/// One received datagram and the descriptors that came with it.
#[derive(Debug)]
pub struct Received {
    /// The datagram.
    pub bytes: Vec<u8>,
    /// Descriptors, in order, already close-on-exec; each is closed where
    /// it is dropped only when that cannot block ([`PeerFd`]).
    pub fds: Vec<PeerFd>,
}

/// Receives one datagram, waiting at most `timeout`. `Ok(None)` on timeout.
///
/// # Errors
/// [`Error::BadMessage`] when the datagram or its descriptors were truncated
/// (`MSG_TRUNC` / `MSG_CTRUNC`); [`Error::Io`] on EOF (`UnexpectedEof`) or
/// OS failure.
pub fn recv(fd: BorrowedFd<'_>, timeout: Duration) -> Result<Option<Received>> {
    if !readable(fd, timeout)? {
        return Ok(None);
    }
    let mut buf = vec![0u8; MAX_MSG_BYTES + 1];
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut iov = [IoSliceMut::new(&mut buf)];
    let msg = match rustix::net::recvmsg(
        fd,
        &mut iov,
        &mut control,
        RecvFlags::CMSG_CLOEXEC | RecvFlags::DONTWAIT,
    ) {
        Ok(m) => m,
        Err(Errno::AGAIN) | Err(Errno::INTR) => return Ok(None),
        Err(e) => return Err(Error::io("recvmsg", e)),
    };
    // Take ownership of every descriptor first, so none leaks on an error
    // (and none closes on this thread if that could block).
    let mut fds = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(it) = m {
            fds.extend(it.map(PeerFd::new));
        }
    }
    if msg.flags.contains(ReturnFlags::CTRUNC) {
        return Err(Error::BadMessage("descriptors were truncated (MSG_CTRUNC)".into()));
    }
    if msg.flags.contains(ReturnFlags::TRUNC) || msg.bytes > MAX_MSG_BYTES {
        return Err(Error::BadMessage(format!("datagram longer than {MAX_MSG_BYTES} bytes")));
    }
    if msg.bytes == 0 {
        return Err(Error::io(
            "peer closed the connection",
            std::io::ErrorKind::UnexpectedEof,
        ));
    }
    buf.truncate(msg.bytes);
    Ok(Some(Received { bytes: buf, fds }))
}

/// The peer's uid and gid (`SO_PEERCRED`).
pub fn peer_ids(fd: BorrowedFd<'_>) -> Result<(u32, u32)> {
    let c = rustix::net::sockopt::socket_peercred(fd).ctx(|| "SO_PEERCRED".into())?;
    Ok((c.uid.as_raw(), c.gid.as_raw()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory of a test's own, removed on drop with the lock file the
    /// listener leaves beside its socket.
    struct TmpDir(PathBuf);

    impl Drop for TmpDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A socket path in a fresh directory, and the directory's guard.
    fn tmp(name: &str) -> (TmpDir, PathBuf) {
        let d = std::env::temp_dir().join(format!("vramring-t-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let p = d.join("s.sock");
        (TmpDir(d), p)
    }

    #[test]
    fn a_live_socket_is_never_replaced_by_a_second_listener() {
        let (_dir, p) = tmp("live");
        let l = Listener::bind(&p, 0o660).unwrap();
        assert!(matches!(Listener::bind(&p, 0o660), Err(Error::AddressInUse(_))));
        drop(l);
        assert!(!p.exists(), "owner unlinks its socket");
    }

    #[test]
    fn a_stale_socket_file_is_replaced() {
        let (_dir, p) = tmp("stale");
        {
            // A socket bound with no lock holder and no listener: stale.
            let fd = seqpacket().unwrap();
            rustix::net::bind(&fd, &SocketAddrUnix::new(&p).unwrap()).unwrap();
        }
        assert!(p.exists());
        let _l = Listener::bind(&p, 0o600).unwrap();
        assert!(connect(&p).is_ok());
    }

    #[test]
    fn a_regular_file_at_the_path_is_not_deleted() {
        let (_dir, p) = tmp("regular");
        std::fs::write(&p, b"x").unwrap();
        assert!(Listener::bind(&p, 0o600).is_err());
        assert!(p.exists());
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn a_readiness_wait_of_duration_max_waits_instead_of_failing() {
        let (a, b) =
            rustix::net::socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None).unwrap();
        send(a.as_fd(), b"x", &[]).unwrap();
        assert!(readable(b.as_fd(), Duration::MAX).unwrap());
        assert_eq!(recv(b.as_fd(), Duration::MAX).unwrap().unwrap().bytes, b"x");
    }

    #[test]
    fn a_received_socket_closes_without_lingering() {
        let (a, b) =
            rustix::net::socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None).unwrap();
        let (x, _y) =
            rustix::net::socketpair(AddressFamily::UNIX, SocketType::STREAM, SocketFlags::CLOEXEC, None).unwrap();
        rustix::net::sockopt::set_socket_linger(&x, Some(Duration::from_secs(30))).unwrap();
        send(a.as_fd(), b"x", &[x.as_fd()]).unwrap();
        let got = recv(b.as_fd(), Duration::from_secs(1)).unwrap().unwrap();
        assert_eq!(
            rustix::net::sockopt::socket_linger(&got.fds[0]).unwrap(),
            Some(Duration::ZERO),
            "a received socket keeps the linger its sender set"
        );
    }

    #[test]
    fn descriptors_travel_with_the_datagram() {
        let (a, b) =
            rustix::net::socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None).unwrap();
        let (r, w) = rustix::pipe::pipe().unwrap();
        send(a.as_fd(), b"hello", &[r.as_fd(), w.as_fd()]).unwrap();
        let got = recv(b.as_fd(), Duration::from_secs(1)).unwrap().unwrap();
        assert_eq!(got.bytes, b"hello");
        assert_eq!(got.fds.len(), 2);
        let (uid, _gid) = peer_ids(b.as_fd()).unwrap();
        assert_eq!(uid, rustix::process::getuid().as_raw());
        drop(a);
        assert!(peer_closed(b.as_fd()));
    }

    #[test]
    fn allow_list_checks_uid_or_gid() {
        assert!(AccessPolicy::default().allows(5, 5));
        let p = AccessPolicy {
            uids: vec![1000],
            gids: vec![44],
        };
        assert!(p.allows(1000, 1));
        assert!(p.allows(1, 44));
        assert!(!p.allows(1, 1));
    }
}
