//! Stop signals and the terminal: SIGINT/SIGTERM/SIGHUP set a flag that
//! long-running commands poll; `top` puts the terminal in raw mode (rustix
//! termios) and restores it on every way out.

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rustix::termios::{self, OptionalActions, Termios};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_signal: libc::c_int) {
    // Relaxed: a lone flag, polled; async-signal-safe.
    STOP.store(true, Ordering::Relaxed);
}

/// Installs the handler for SIGINT, SIGTERM and SIGHUP.
pub fn install_stop_handler() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: `on_signal` only stores to an atomic, which is
        // async-signal-safe; the handler stays valid for the whole process.
        unsafe {
            libc::signal(sig, on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t);
        }
    }
}

/// Whether a stop signal arrived (or [`request_stop`] was called).
pub fn stop_requested() -> bool {
    // Relaxed: see `on_signal`.
    STOP.load(Ordering::Relaxed)
}

/// Asks long-running loops to end.
pub fn request_stop() {
    STOP.store(true, Ordering::Relaxed);
}

/// Whether stdin and stdout are both terminals.
pub fn interactive() -> bool {
    termios::isatty(std::io::stdin().as_fd()) && termios::isatty(std::io::stdout().as_fd())
}

/// Raw mode on stdin for as long as it lives, the alternate screen on
/// stdout with the cursor hidden; both restored on drop (also on a panic
/// that unwinds).
pub struct RawTerminal {
    saved: Termios,
}

impl RawTerminal {
    /// Enters raw mode and the alternate screen.
    ///
    /// # Errors
    /// When stdin is not a terminal.
    pub fn enter() -> std::io::Result<RawTerminal> {
        let stdin = std::io::stdin();
        let saved = termios::tcgetattr(stdin.as_fd())?;
        let mut raw = saved.clone();
        raw.make_raw();
        termios::tcsetattr(stdin.as_fd(), OptionalActions::Flush, &raw)?;
        print!("\x1b[?1049h\x1b[?25l");
        Ok(RawTerminal { saved })
    }

    /// Waits up to `timeout` for a key; `true` when it asks to quit
    /// (`q`, `Q`, Ctrl-C, Ctrl-D, Esc).
    pub fn quit_key(&self, timeout: Duration) -> bool {
        let stdin = std::io::stdin();
        let ts = rustix::time::Timespec {
            tv_sec: timeout.as_secs().min(i64::MAX as u64) as _,
            tv_nsec: timeout.subsec_nanos() as _,
        };
        let mut fds = [rustix::event::PollFd::new(&stdin, rustix::event::PollFlags::IN)];
        match rustix::event::poll(&mut fds, Some(&ts)) {
            Ok(n) if n > 0 => {
                let mut buf = [0u8; 64];
                match rustix::io::read(stdin.as_fd(), &mut buf) {
                    Ok(0) => true,
                    Ok(n) => buf[..n].iter().any(|&b| matches!(b, b'q' | b'Q' | 3 | 4 | 0x1b)),
                    Err(_) => false,
                }
            }
            _ => false,
        }
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        print!("\x1b[?25h\x1b[?1049l");
        let _ = std::io::Write::flush(&mut std::io::stdout());
        let _ = termios::tcsetattr(std::io::stdin().as_fd(), OptionalActions::Flush, &self.saved);
    }
}
