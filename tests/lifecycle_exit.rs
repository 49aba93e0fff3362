//! `std::process::exit` with live vramring workers: the process-exit hook
//! stops and joins them in phase order, and the process exits 0 promptly.
//!
//! Each test re-executes this test binary as a child that runs only
//! `exit_child`, with the scenario in `VRAMRING_EXIT_SCENARIO`; the child
//! appends marker lines to the file named by `VRAMRING_EXIT_MARKER`, and the
//! parent checks the exit status and the markers. "Promptly" is checked by
//! what the scenarios do: a worker that is never stopped loops for ever, so
//! an exit that waited for it would not come before [`HANG`].

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vramring::seam::lifecycle::{register, ExitPhase, ExitShutdown, ExitWorker, MemoryWatchdog, WatchdogAction};

const SCENARIO: &str = "VRAMRING_EXIT_SCENARIO";
const MARKER: &str = "VRAMRING_EXIT_MARKER";
/// How long a child may run before it is taken to hang and killed: far past
/// any delay a busy machine causes (the scenarios take well under a
/// second), and past the 60 s a scenario sleeps before it fails.
const HANG: Duration = Duration::from_secs(120);

fn append_marker(path: &Path, line: &str) {
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("open marker");
    f.write_all(format!("{line}\n").as_bytes()).expect("write marker");
}

/// A service-like thread: loops until stopped, then writes its marker.
fn spawn_service(marker: PathBuf) -> ExitWorker {
    ExitWorker::spawn("test-service", ExitPhase::Service, move |stop| {
        while !stop.sleep(Duration::from_millis(1)) {}
        append_marker(&marker, "service stopped");
    })
    .expect("spawn service worker")
}

/// Runs last at exit and records `report()`, proving phase order.
struct Teardown {
    marker: PathBuf,
    report: Box<dyn Fn() -> String + Send + Sync>,
}

impl ExitShutdown for Teardown {
    fn phase(&self) -> ExitPhase {
        ExitPhase::CudaTeardown
    }
    fn shutdown_for_process_exit(&self) {
        append_marker(&self.marker, &format!("teardown {}", (self.report)()));
    }
}

fn register_teardown(marker: &Path, report: impl Fn() -> String + Send + Sync + 'static) {
    let teardown = Teardown {
        marker: marker.to_owned(),
        report: Box::new(report),
    };
    // Stays registered for the rest of the process on purpose.
    let _registration = register(Arc::new(teardown)).expect("register teardown");
}

/// The child's body. Without the scenario variable (a normal test run) it
/// does nothing.
#[test]
fn exit_child() {
    let Ok(scenario) = std::env::var(SCENARIO) else {
        return;
    };
    let marker = PathBuf::from(std::env::var_os(MARKER).expect("marker path"));
    match scenario.as_str() {
        "service" => {
            let service: &'static ExitWorker = Box::leak(Box::new(spawn_service(marker.clone())));
            register_teardown(&marker, || format!("service_finished={}", service.is_finished()));
            std::process::exit(0);
        }
        "watchdog" => {
            let _service = Box::leak(Box::new(spawn_service(marker.clone())));
            let watchdog: &'static MemoryWatchdog = Box::leak(Box::new(
                MemoryWatchdog::start(
                    Box::new(|| Some(1 << 30)),
                    1 << 20,
                    Duration::from_secs(3600),
                    WatchdogAction::Report,
                )
                .expect("start watchdog"),
            ));
            register_teardown(&marker, || format!("watchdog_running={}", watchdog.is_running()));
            std::process::exit(0);
        }
        "stuck" => {
            let stuck: &'static ExitWorker = Box::leak(Box::new(
                ExitWorker::builder("test-stuck", ExitPhase::Service)
                    .join_timeout(Duration::from_millis(200))
                    .spawn(|_ignored_stop| loop {
                        std::thread::sleep(Duration::from_secs(60));
                    })
                    .expect("spawn stuck worker"),
            ));
            register_teardown(&marker, || format!("stuck_finished={}", stuck.is_finished()));
            std::process::exit(0);
        }
        "exit_from_watchdog" => {
            let _service = Box::leak(Box::new(spawn_service(marker.clone())));
            register_teardown(&marker, || "ran".to_owned());
            let _watchdog = Box::leak(Box::new(
                MemoryWatchdog::start(
                    Box::new(|| Some(0)),
                    1 << 20,
                    Duration::from_millis(1),
                    WatchdogAction::callback(|_| std::process::exit(0)),
                )
                .expect("start watchdog"),
            ));
            std::thread::sleep(Duration::from_secs(60));
            panic!("the watchdog's callback should have ended the process");
        }
        "live_ring_host" | "live_ring_cuda" => live_ring(&marker, scenario == "live_ring_cuda"),
        other => panic!("unknown scenario {other}"),
    }
}

/// A live publisher (its socket service thread running) and a live
/// subscriber that has just received a frame; then `exit(0)` with both still
/// alive. The registry stops and joins the service thread, which marks the
/// ring closed; the teardown marker then reads the subscriber's view of it.
fn live_ring(marker: &Path, cuda: bool) {
    use vramring::BackendChoice;
    use vramring::{Error, Format, FrameMeta, Publisher, RingConfig, Subscriber, SubscriberOptions};
    // The parent's temp dir, which it removes after the child exits.
    let dir = marker.parent().expect("the marker is in the parent's temp dir");
    let backend = if cuda {
        BackendChoice::Cuda(0)
    } else {
        BackendChoice::Host
    };
    let cfg = RingConfig::new(Format::Nv12, 640, 360).backend(backend);
    let publisher: &'static mut Publisher = Box::leak(Box::new(
        Publisher::create(dir.join("ring.sock"), cfg).expect("publisher"),
    ));
    let sub: &'static mut Subscriber = Box::leak(Box::new(
        Subscriber::connect(dir.join("ring.sock"), SubscriberOptions::default()).expect("subscriber"),
    ));
    let slot = publisher.loan(Duration::from_secs(1)).expect("loan");
    if cuda {
        // SAFETY: the legacy default stream; the slot is untouched (the
        // frame's bytes do not matter here, only its commit).
        unsafe { slot.publish_cuda(FrameMeta::pts(7), vramring::cuda::Stream::LEGACY_DEFAULT) }.expect("publish");
    } else {
        slot.publish(FrameMeta::pts(7)).expect("publish");
    }
    assert_eq!(sub.next(Duration::from_secs(5)).expect("frame").pts(), 7);
    let sub_addr = sub as *mut Subscriber as usize;
    register_teardown(marker, move || {
        // SAFETY: the subscriber is leaked (lives for the whole process) and
        // no other thread uses it at exit.
        let sub = unsafe { &mut *(sub_addr as *mut Subscriber) };
        let gone = matches!(sub.next(Duration::from_millis(500)), Err(Error::ProducerGone { .. }));
        format!("subscriber_saw_producer_gone={gone}")
    });
    std::process::exit(0);
}

/// Runs `scenario` in a child and asserts that it exited 0 (before [`HANG`])
/// and wrote exactly `expected` to its marker file.
fn assert_child_exits_0_promptly(scenario: &str, expected: &[&str]) {
    let dir = vramring_testkit::procs::TempDir::new(&format!("exit-{scenario}"));
    let marker = dir.join("marker.txt");
    let start = Instant::now();
    let mut child = Command::new(std::env::current_exe().expect("current exe"))
        .args(["--exact", "exit_child", "--nocapture", "--test-threads=1"])
        .env(SCENARIO, scenario)
        .env(MARKER, &marker)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn child");
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for child") {
            break status;
        }
        if start.elapsed() > HANG {
            let _ = child.kill();
            let _ = child.wait();
            panic!("child scenario {scenario} still running after {HANG:?}: its exit hangs");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let mut output = String::new();
    if let Some(mut out) = child.stdout.take() {
        let _ = out.read_to_string(&mut output);
    }
    if let Some(mut err) = child.stderr.take() {
        let _ = err.read_to_string(&mut output);
    }
    let markers = std::fs::read_to_string(&marker).unwrap_or_default();
    assert_eq!(
        status.code(),
        Some(0),
        "child scenario {scenario} exited with {status}; output:\n{output}"
    );
    assert_eq!(markers.lines().collect::<Vec<_>>(), expected, "scenario {scenario}");
}

#[test]
fn process_exit_stops_and_joins_a_service_thread_before_teardown() {
    assert_child_exits_0_promptly("service", &["service stopped", "teardown service_finished=true"]);
}

#[test]
fn process_exit_with_a_live_watchdog_exits_promptly() {
    assert_child_exits_0_promptly("watchdog", &["service stopped", "teardown watchdog_running=false"]);
}

#[test]
fn a_worker_that_ignores_stop_delays_exit_only_by_its_join_timeout() {
    assert_child_exits_0_promptly("stuck", &["teardown stuck_finished=false"]);
}

#[test]
fn process_exit_with_a_live_publisher_and_subscriber_exits_0_promptly() {
    assert_child_exits_0_promptly("live_ring_host", &["teardown subscriber_saw_producer_gone=true"]);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn process_exit_with_a_live_cuda_publisher_and_subscriber_exits_0_promptly() {
    assert_child_exits_0_promptly("live_ring_cuda", &["teardown subscriber_saw_producer_gone=true"]);
}

#[test]
fn exit_called_on_the_watchdog_thread_does_not_wait_for_itself() {
    assert_child_exits_0_promptly("exit_from_watchdog", &["service stopped", "teardown ran"]);
}
