//! Python exceptions mirroring [`vramring::Error`], one class per variant,
//! all subclasses of `vramring.VramringError`. Messages are the Rust
//! `Display` text, unchanged.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use vramring::Error;

create_exception!(
    vramring,
    VramringError,
    PyException,
    "Base class of every vramring error."
);
create_exception!(
    vramring,
    VersionMismatch,
    VramringError,
    "The peer speaks another protocol version."
);
create_exception!(
    vramring,
    LayoutMismatch,
    VramringError,
    "A shared layout read from a peer failed validation."
);
create_exception!(
    vramring,
    BadMessage,
    VramringError,
    "A socket message from the peer was malformed."
);
create_exception!(
    vramring,
    Refused,
    VramringError,
    "The publisher refused the subscription."
);
create_exception!(
    vramring,
    ProducerGone,
    VramringError,
    "The publisher went away (exit, crash or close)."
);
create_exception!(
    vramring,
    Evicted,
    VramringError,
    "The publisher evicted this subscriber."
);
create_exception!(vramring, Timeout, VramringError, "A wait ran out of time.");
create_exception!(
    vramring,
    Overrun,
    VramringError,
    "The frame was overwritten while it was read."
);
create_exception!(
    vramring,
    LosslessBlocked,
    VramringError,
    "A lossless subscriber still holds the slot."
);
create_exception!(
    vramring,
    AddressInUse,
    VramringError,
    "A live publisher already listens at the path."
);
create_exception!(vramring, ConfigError, VramringError, "The configuration is invalid.");
create_exception!(
    vramring,
    WrongBackend,
    VramringError,
    "The operation needs another memory backend."
);
create_exception!(
    vramring,
    CudaUnavailable,
    VramringError,
    "CUDA is not usable on this machine."
);
create_exception!(vramring, DriverError, VramringError, "A CUDA driver call failed.");
create_exception!(
    vramring,
    OutOfDeviceMemory,
    VramringError,
    "Not enough free device memory."
);
create_exception!(
    vramring,
    DeviceNotVisible,
    VramringError,
    "The publisher's GPU is not visible here."
);
create_exception!(
    vramring,
    PermissionDenied,
    VramringError,
    "The peer is not on the allow-list."
);
create_exception!(
    vramring,
    TooManySubscribers,
    VramringError,
    "The subscriber table is full."
);
create_exception!(vramring, IoError, VramringError, "An operating-system call failed.");
create_exception!(
    vramring,
    TooLarge,
    VramringError,
    "A payload is larger than the ring allows."
);
create_exception!(vramring, Closed, VramringError, "The object was closed already.");
create_exception!(
    vramring,
    PacketOverrun,
    VramringError,
    "A packet was overwritten before it was read."
);
create_exception!(
    vramring,
    FramesHeld,
    VramringError,
    "The caller holds more frames (or tensors made from them) than the subscriber's max_held."
);

/// The Python exception for `e`, with `e`'s `Display` text.
pub fn to_py(e: Error) -> PyErr {
    let msg = e.to_string();
    match e {
        Error::VersionMismatch { .. } => VersionMismatch::new_err(msg),
        Error::LayoutMismatch(_) => LayoutMismatch::new_err(msg),
        Error::BadMessage(_) => BadMessage::new_err(msg),
        Error::Refused { .. } => Refused::new_err(msg),
        Error::ProducerGone { .. } => ProducerGone::new_err(msg),
        Error::Evicted { .. } => Evicted::new_err(msg),
        Error::Timeout(..) => Timeout::new_err(msg),
        Error::Overrun { .. } => Overrun::new_err(msg),
        Error::LosslessBlocked { .. } => LosslessBlocked::new_err(msg),
        Error::AddressInUse(_) => AddressInUse::new_err(msg),
        Error::Config(_) => ConfigError::new_err(msg),
        Error::WrongBackend { .. } => WrongBackend::new_err(msg),
        Error::CudaUnavailable(_) => CudaUnavailable::new_err(msg),
        Error::Driver { .. } => DriverError::new_err(msg),
        Error::OutOfDeviceMemory { .. } => OutOfDeviceMemory::new_err(msg),
        Error::DeviceNotVisible { .. } => DeviceNotVisible::new_err(msg),
        Error::PermissionDenied { .. } => PermissionDenied::new_err(msg),
        Error::TooManySubscribers(_) => TooManySubscribers::new_err(msg),
        Error::Io { .. } => IoError::new_err(msg),
        Error::TooLarge { .. } => TooLarge::new_err(msg),
        Error::Closed => Closed::new_err(msg),
        Error::PacketOverrun { .. } => PacketOverrun::new_err(msg),
        _ => VramringError::new_err(msg),
    }
}

/// `Result` into `PyResult`.
pub trait IntoPy<T> {
    /// Maps the error with [`to_py`].
    fn py_err(self) -> PyResult<T>;
}

impl<T> IntoPy<T> for vramring::Result<T> {
    fn py_err(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}

/// Adds every exception class to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    macro_rules! add {
        ($($t:ident),* $(,)?) => {$( m.add(stringify!($t), py.get_type::<$t>())?; )*};
    }
    add!(
        VramringError,
        VersionMismatch,
        LayoutMismatch,
        BadMessage,
        Refused,
        ProducerGone,
        Evicted,
        Timeout,
        Overrun,
        LosslessBlocked,
        AddressInUse,
        ConfigError,
        WrongBackend,
        CudaUnavailable,
        DriverError,
        OutOfDeviceMemory,
        DeviceNotVisible,
        PermissionDenied,
        TooManySubscribers,
        IoError,
        TooLarge,
        Closed,
        PacketOverrun,
        FramesHeld,
    );
    Ok(())
}
