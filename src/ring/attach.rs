//! Attaching to a ring: the descriptors a Welcome carries turned into
//! mapped regions, each checked (seals, sizes, the header against the
//! Welcome) before anything in it is read. The one path subscribers of both
//! ring kinds and the inspector take.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use crate::error::{Error, Result};
use crate::layout::{RingHeader, RingInfo, SubsHeader, CLIENT_BYTES};
use crate::shm::{Region, SEALS_FIXED_SIZE, SEALS_READ_ONLY};
use crate::socket::msg::Welcome;

/// Maps the two regions every Welcome carries after the control region:
/// the publisher's subscriber table (read-only, sealed) and our own client
/// region (read-write, fixed size), checking their seals and sizes before
/// the first load.
///
/// # Errors
/// [`Error::LayoutMismatch`] for missing seals or sizes that do not fit.
pub(crate) fn map_table_and_client(
    welcome: &Welcome,
    subs_fd: &OwnedFd,
    client_fd: &OwnedFd,
) -> Result<(Region, Region)> {
    Region::require_seals(subs_fd.as_fd(), SEALS_READ_ONLY)?;
    Region::require_seals(client_fd.as_fd(), SEALS_FIXED_SIZE)?;
    if welcome.subs_bytes < std::mem::size_of::<SubsHeader>() as u64 || welcome.client_bytes != CLIENT_BYTES {
        return Err(Error::LayoutMismatch(format!(
            "Welcome announces a subscriber table of {} bytes and a client region of {} bytes \
             (a table needs at least {}, a client region is {CLIENT_BYTES})",
            welcome.subs_bytes,
            welcome.client_bytes,
            std::mem::size_of::<SubsHeader>()
        )));
    }
    let subs = Region::map(subs_fd.as_fd(), welcome.subs_bytes, false)?;
    let client = Region::map(client_fd.as_fd(), CLIENT_BYTES, true)?;
    Ok((subs, client))
}

/// Maps a frame ring's control region and subscriber table (both
/// read-only) and the subscriber's client region from a Welcome's
/// descriptors, and validates them against the Welcome.
///
/// # Errors
/// [`Error::LayoutMismatch`] for missing seals, short regions or a header
/// that disagrees with the Welcome; [`Error::Io`] when mapping fails.
pub(crate) fn map_frame_ring(
    welcome: &Welcome,
    control_fd: BorrowedFd<'_>,
    subs_fd: &OwnedFd,
    client_fd: &OwnedFd,
) -> Result<(Region, RingInfo, Region, Region)> {
    // The control region must be sealed read-only and fixed-size: then
    // the publisher cannot shrink it under our mapping, and we could not
    // write it even by mistake.
    Region::require_seals(control_fd, SEALS_READ_ONLY)?;
    // `Region::at` treats a region too short for its struct as a bug, so
    // a peer's short size is refused here, before any header is read.
    if welcome.control_bytes < std::mem::size_of::<RingHeader>() as u64 {
        return Err(Error::LayoutMismatch(format!(
            "Welcome announces a control region of {} bytes, shorter than its header",
            welcome.control_bytes
        )));
    }
    let control = Region::map(control_fd, welcome.control_bytes, false)?;
    let info = RingInfo::validate(control.at::<RingHeader>(0), control.len() as u64)?;
    if info.epoch != welcome.epoch
        || info.backend != welcome.backend
        || info.pool_bytes != welcome.pool_bytes
        || info.device_uuid != welcome.device_uuid
    {
        return Err(Error::LayoutMismatch(
            "Welcome disagrees with the control region".into(),
        ));
    }
    let (subs, client) = map_table_and_client(welcome, subs_fd, client_fd)?;
    subs.at::<SubsHeader>(0)
        .validate(info.max_subscribers, info.epoch, subs.len() as u64)?;
    Ok((control, info, subs, client))
}

/// Maps a packet ring's subscriber table (read-only) and the subscriber's
/// client region from a Welcome's descriptors and validates them; returns
/// both and the table's entry count.
///
/// # Errors
/// [`Error::LayoutMismatch`] for missing seals, a short table or one of
/// another publisher instance; [`Error::Io`] when mapping fails.
pub(crate) fn map_packet_table(
    welcome: &Welcome,
    subs_fd: &OwnedFd,
    client_fd: &OwnedFd,
) -> Result<(Region, Region, u32)> {
    let (subs, client) = map_table_and_client(welcome, subs_fd, client_fd)?;
    let (max, subs_epoch) = subs.at::<SubsHeader>(0).validate_shape(subs.len() as u64)?;
    if subs_epoch != welcome.epoch {
        return Err(Error::LayoutMismatch(
            "subscriber table belongs to another publisher instance".into(),
        ));
    }
    Ok((subs, client, max))
}
