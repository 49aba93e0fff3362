//! Isolation on a real GPU: a push-only subscriber of a CUDA ring never
//! holds a handle to the pool, and a publisher that refuses pull delivery
//! keeps the pool to itself while push subscribers get whole frames.
//!
//! The CUDA driver cannot make an imported VMM allocation read-only (the
//! importer sets its own access with `cuMemSetAccess`), so keeping the pool
//! out of a subscriber's hands is the only guarantee there is: these tests
//! prove it holds. Run on a GPU machine with
//! `cargo test --test gpu_isolation -- --include-ignored`.

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use vramring::seam::cuda::{CudaImport, RealDriver};
use vramring::seam::socket::msg::{self, Hello, Msg};
use vramring::seam::socket::transport;
use vramring::{BackendChoice, Format, Publisher, PullAccess, RingConfig, Subscriber, SubscriberOptions};
use vramring_testkit::gpu::GpuTestPattern;

type R<T = ()> = Result<T, Box<dyn std::error::Error>>;

fn sock(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("vramring-gpu-iso-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(format!("{name}.sock"))
}

fn raw_hello(path: &std::path::Path, flags: u32) -> R<(Msg, Vec<std::os::fd::OwnedFd>)> {
    let s = transport::connect(path)?;
    let hello = Hello {
        flags,
        backends: (1 << vramring::seam::layout::BACKEND_HOST) | (1 << vramring::seam::layout::BACKEND_CUDA),
        name: "probe".into(),
        device_uuid: [0; 16],
    };
    transport::send(s.as_fd(), &Msg::Hello(hello).encode(), &[])?;
    let got = transport::recv(s.as_fd(), Duration::from_secs(5))?.ok_or("no answer")?;
    Ok((
        Msg::decode(&got.bytes)?,
        got.fds
            .into_iter()
            .map(vramring::seam::socket::PeerFd::into_owned)
            .collect(),
    ))
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_push_only_subscriber_of_a_cuda_ring_holds_no_handle_to_the_pool() -> R {
    let path = sock("push-only");
    let cfg = RingConfig::new(Format::Nv12, 1920, 1080)
        .slots(4)
        .backend(BackendChoice::Cuda(0))
        .pull(PullAccess::Nobody);
    let mut p = Publisher::create(&path, cfg)?;
    let info = *p.info();

    // Pull is refused outright.
    let (answer, fds) = raw_hello(&path, 0)?;
    match answer {
        Msg::Reject(n) => assert_eq!(n.code, msg::REJECT_PULL_DENIED, "{}", n.reason),
        other => panic!("a pull Hello got {other:?}"),
    }
    assert!(fds.is_empty());

    // A push Welcome carries control, table and client region: 3 memfds,
    // none of which the driver accepts as a CUDA allocation.
    let (answer, fds) = raw_hello(&path, msg::HELLO_PUSH)?;
    let Msg::Welcome(w) = answer else {
        panic!("a push Hello got {answer:?}")
    };
    assert_eq!(w.pool_bytes, info.pool_bytes());
    assert_eq!(fds.len(), 3, "a push subscriber receives no pool descriptor");
    let driver = RealDriver::shared()?;
    for (k, fd) in fds.into_iter().enumerate() {
        let link = std::fs::read_link(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd)))?;
        assert!(
            link.to_string_lossy().starts_with("/memfd:"),
            "descriptor {k} is {link:?}, not a memfd"
        );
        match CudaImport::import(
            std::sync::Arc::clone(&driver),
            fd,
            info.pool_bytes(),
            info.device_uuid(),
            false,
        ) {
            Ok(_) => panic!("descriptor {k} of a push Welcome imported as the pool"),
            Err(e) => eprintln!("descriptor {k}: import refused as expected: {e}"),
        }
    }

    // And a real push subscriber gets every frame whole, by push.
    let gpu = GpuTestPattern::for_uuid(info.device_uuid())?;
    let mut s = Subscriber::connect(&path, SubscriberOptions::default().push(true))?;
    let t = Instant::now();
    while !s.push_active() {
        assert!(t.elapsed() < vramring_testkit::hang::HANG, "push never became active");
        let slot = p.loan(Duration::from_millis(100))?;
        let seq = slot.seq();
        vramring_testkit::gpu::fill_cuda(&gpu, slot, seq)?;
        std::thread::sleep(Duration::from_millis(2));
    }
    let mut ok = 0;
    for _ in 0..500 {
        let slot = p.loan(Duration::from_millis(100))?;
        let seq = slot.seq();
        vramring_testkit::gpu::fill_cuda(&gpu, slot, seq)?;
        // The commit is enqueued, not made: a frame pushed before this one
        // may still be the newest when the subscriber looks.
        let mut f = s.next(Duration::from_secs(1))?;
        while f.seq() < seq {
            f = s.next(Duration::from_secs(1))?;
        }
        assert!(f.pushed(), "frame {} was not pushed", f.seq());
        assert_eq!(f.seq(), seq);
        vramring_testkit::gpu::verify_cuda(&gpu, &f)?.map_err(|e| format!("frame {seq}: {e}"))?;
        ok += 1;
    }
    assert_eq!(ok, 500);
    // A push subscriber's borrow reads its own pushed buffer in place,
    // never the pool (it has none).
    let slot = p.loan(Duration::from_millis(100))?;
    let seq = slot.seq();
    vramring_testkit::gpu::fill_cuda(&gpu, slot, seq)?;
    let mut b = s.borrow(Duration::from_secs(1))?;
    while b.seq() < seq {
        b.release()?;
        b = s.borrow(Duration::from_secs(1))?;
    }
    assert_eq!(b.seq(), seq);
    b.release()?;
    eprintln!("push-only: 500 1080p frames pushed and verified on the GPU; the pool never left the publisher");
    drop(s);
    p.close()?;
    Ok(())
}
