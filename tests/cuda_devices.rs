//! Device discovery and free-memory probes of the CUDA backend, on the fake
//! driver: devices are matched by UUID whatever their ordinal, an invisible
//! UUID is a typed error, and the probes release what they take.

use std::sync::Arc;

use vramring::seam::cuda::{device_free_bytes, find_device_by_uuid, free_memory_probe, probe_with, DeviceInfo, Driver};
use vramring::seam::lifecycle::memwatch::mem_available_bytes;
use vramring::Error;
use vramring_testkit::fake::{FakeDevice, FakeDriver};

fn uuid(n: u8) -> [u8; 16] {
    let mut u = [0u8; 16];
    u[0] = n;
    u[15] = 0xA5;
    u
}

#[test]
fn a_uuid_finds_its_device_whatever_its_ordinal() {
    let d = FakeDriver::new(vec![FakeDevice::discrete(uuid(7)), FakeDevice::discrete(uuid(3))]);
    d.init().unwrap();
    assert_eq!(find_device_by_uuid(&*d, &uuid(3)).unwrap(), 1);
    assert_eq!(find_device_by_uuid(&*d, &uuid(7)).unwrap(), 0);
}

#[test]
fn an_invisible_uuid_is_named_in_the_error() {
    let d = FakeDriver::new(vec![FakeDevice::discrete(uuid(7))]);
    d.init().unwrap();
    match find_device_by_uuid(&*d, &uuid(9)) {
        Err(Error::DeviceNotVisible { uuid }) => {
            assert_eq!(uuid, "GPU-09000000-0000-0000-0000-0000000000a5")
        }
        other => panic!("expected DeviceNotVisible, got {other:?}"),
    }
}

#[test]
fn probe_reports_what_each_device_supports() {
    let mut old = FakeDevice::discrete(uuid(2));
    old.posix_fd = false;
    let d = FakeDriver::new(vec![FakeDevice::discrete(uuid(1)), old]);
    let devs = probe_with(&*d).unwrap();
    assert_eq!(devs.iter().map(DeviceInfo::usable).collect::<Vec<_>>(), [true, false]);
}

#[test]
fn free_memory_on_an_integrated_gpu_counts_host_memory_too() {
    // The driver says 1 byte is free on both devices; only the integrated one
    // adds the host's MemAvailable. MemAvailable moves between reads, so the
    // integrated figure is checked against the 1 byte, not a second read.
    let mut igpu = FakeDevice::discrete(uuid(1));
    igpu.integrated = true;
    igpu.free = 1;
    let mut dgpu = FakeDevice::discrete(uuid(2));
    dgpu.free = 1;
    let d = FakeDriver::new(vec![igpu, dgpu]);
    d.init().unwrap();
    assert!(
        mem_available_bytes().is_some_and(|b| b > 1),
        "this host's MemAvailable is unreadable"
    );
    for (dev, integrated) in [(0, true), (1, false)] {
        let ctx = d.primary_ctx_retain(dev).unwrap();
        // SAFETY: `ctx` was just retained on `dev`.
        let free = unsafe { device_free_bytes(&*d, ctx, dev) }.unwrap();
        d.primary_ctx_release(dev).unwrap();
        if integrated {
            assert!(
                free > 1,
                "the integrated GPU reported {free} bytes free, host memory not counted"
            );
        } else {
            assert_eq!(free, 1, "the discrete GPU counted host memory");
        }
    }
    assert!(d.leaks().is_empty(), "{:?}", d.leaks());
}

#[test]
fn the_watchdog_probe_reads_free_memory_and_releases_its_context() {
    let d = FakeDriver::with_one_gpu(uuid(1));
    d.init().unwrap();
    let mut probe = free_memory_probe(Arc::clone(&d), 0).unwrap();
    assert_eq!(probe(), Some(16 << 30));
    drop(probe);
    assert!(d.leaks().is_empty(), "{:?}", d.leaks());
}
