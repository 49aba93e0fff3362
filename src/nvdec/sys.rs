//! A small run-time binding of the NVDEC API (`libnvcuvid`): the dozen calls
//! and structs the decoder uses, nothing more.
//!
//! The library ships with the NVIDIA driver (not with the CUDA toolkit or the
//! Video Codec SDK), so it is opened with `dlopen` when a decoder is first
//! made, as `cudarc` opens `libcuda`: a machine without it builds and runs
//! everything else, and asking for a decoder there is a typed error. Every
//! entry point is resolved at load; a missing one is an error, never a lazy
//! panic. `CUresult` crosses as a `u32` and C enums as `c_uint`/`c_int`, so a
//! value from a newer driver is matched as an integer, never read into a Rust
//! enum.
//!
//! Layouts are those of the public headers `nvcuvid.h` and `cuviddec.h`
//! (Video Codec SDK; the same declarations are in FFmpeg's `nv-codec-headers`,
//! Debian package `libffmpeg-nvenc-dev` 11.1.5.2, `dynlink_cuviddec.h` and
//! `dynlink_nvcuvid.h`). The sizes and field offsets asserted below were
//! printed by a C program compiled against those headers on x86-64 Linux
//! (LP64: `unsigned long` is 64 bits). Newer SDKs only rename reserved
//! fields, so the sizes hold for the 580 driver too. Only structs the
//! decoder fills or reads are declared; `CUVIDPICPARAMS` (4,280 bytes) goes
//! from the parser's callback straight back to `cuvidDecodePicture` and is
//! never looked into, so it stays opaque.

use std::ffi::{c_int, c_short, c_uint, c_ulong, c_void};
use std::mem::{offset_of, size_of};

/// `CUvideoparser`.
pub type VideoParser = *mut c_void;
/// `CUvideodecoder`.
pub type VideoDecoder = *mut c_void;
/// `CUvideoctxlock`.
pub type CtxLock = *mut c_void;
/// `CUcontext`.
pub type Context = *mut c_void;
/// `CUstream`.
pub type Stream = *mut c_void;
/// `CUVIDPICPARAMS`, opaque here.
pub type PicParams = c_void;

/// `cudaVideoCodec_H264`.
pub const CODEC_H264: c_uint = 4;
/// `cudaVideoCodec_HEVC`.
pub const CODEC_HEVC: c_uint = 8;
/// `cudaVideoCodec_AV1`.
pub const CODEC_AV1: c_uint = 11;
/// `cudaVideoChromaFormat_420`.
pub const CHROMA_420: c_uint = 1;
/// `cudaVideoSurfaceFormat_NV12`.
pub const SURFACE_NV12: c_uint = 0;
/// `cudaVideoDeinterlaceMode_Weave`.
pub const DEINTERLACE_WEAVE: c_uint = 0;
/// `cudaVideoDeinterlaceMode_Adaptive`.
pub const DEINTERLACE_ADAPTIVE: c_uint = 2;
/// `cudaVideoCreate_PreferCUVID`: the dedicated video engines.
pub const CREATE_PREFER_CUVID: c_ulong = 0x04;
/// `CUVID_PKT_ENDOFSTREAM`.
pub const PKT_ENDOFSTREAM: c_ulong = 0x01;
/// `CUVID_PKT_TIMESTAMP`.
pub const PKT_TIMESTAMP: c_ulong = 0x02;
/// `CUVID_PKT_ENDOFPICTURE`: the packet holds exactly one picture.
pub const PKT_ENDOFPICTURE: c_ulong = 0x08;

/// `CUVIDDECODECAPS` (`cuviddec.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct DecodeCaps {
    pub codec_type: c_uint,
    pub chroma_format: c_uint,
    pub bit_depth_minus8: c_uint,
    pub reserved1: [c_uint; 3],
    pub is_supported: u8,
    pub num_nvdecs: u8,
    pub output_format_mask: u16,
    pub max_width: c_uint,
    pub max_height: c_uint,
    pub max_mb_count: c_uint,
    pub min_width: u16,
    pub min_height: u16,
    pub is_histogram_supported: u8,
    pub counter_bit_depth: u8,
    pub max_histogram_bins: u16,
    pub reserved3: [c_uint; 10],
}
const _: () = assert!(size_of::<DecodeCaps>() == 88);
const _: () = assert!(offset_of!(DecodeCaps, is_supported) == 24);
const _: () = assert!(offset_of!(DecodeCaps, output_format_mask) == 26);
const _: () = assert!(offset_of!(DecodeCaps, max_width) == 28);
const _: () = assert!(offset_of!(DecodeCaps, max_mb_count) == 36);
const _: () = assert!(offset_of!(DecodeCaps, min_width) == 40);
const _: () = assert!(offset_of!(DecodeCaps, reserved3) == 48);

/// A `{ short left, top, right, bottom; }` rectangle.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ShortRect {
    pub left: c_short,
    pub top: c_short,
    pub right: c_short,
    pub bottom: c_short,
}

/// `CUVIDDECODECREATEINFO` (`cuviddec.h`); `tcu_ulong` is `unsigned long`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DecodeCreateInfo {
    pub width: c_ulong,
    pub height: c_ulong,
    pub num_decode_surfaces: c_ulong,
    pub codec_type: c_uint,
    pub chroma_format: c_uint,
    pub creation_flags: c_ulong,
    pub bit_depth_minus8: c_ulong,
    pub intra_decode_only: c_ulong,
    pub max_width: c_ulong,
    pub max_height: c_ulong,
    pub reserved1: c_ulong,
    pub display_area: ShortRect,
    pub output_format: c_uint,
    pub deinterlace_mode: c_uint,
    pub target_width: c_ulong,
    pub target_height: c_ulong,
    pub num_output_surfaces: c_ulong,
    pub vid_lock: CtxLock,
    pub target_rect: ShortRect,
    pub enable_histogram: c_ulong,
    pub reserved2: [c_ulong; 4],
}
const _: () = assert!(size_of::<DecodeCreateInfo>() == 176);
const _: () = assert!(offset_of!(DecodeCreateInfo, codec_type) == 24);
const _: () = assert!(offset_of!(DecodeCreateInfo, creation_flags) == 32);
const _: () = assert!(offset_of!(DecodeCreateInfo, display_area) == 80);
const _: () = assert!(offset_of!(DecodeCreateInfo, output_format) == 88);
const _: () = assert!(offset_of!(DecodeCreateInfo, target_width) == 96);
const _: () = assert!(offset_of!(DecodeCreateInfo, vid_lock) == 120);
const _: () = assert!(offset_of!(DecodeCreateInfo, target_rect) == 128);
const _: () = assert!(offset_of!(DecodeCreateInfo, enable_histogram) == 136);
const _: () = assert!(offset_of!(DecodeCreateInfo, reserved2) == 144);

/// `CUVIDPROCPARAMS` (`cuviddec.h`), for `cuvidMapVideoFrame64`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ProcParams {
    pub progressive_frame: c_int,
    pub second_field: c_int,
    pub top_field_first: c_int,
    pub unpaired_field: c_int,
    pub reserved_flags: c_uint,
    pub reserved_zero: c_uint,
    pub raw_input_dptr: u64,
    pub raw_input_pitch: c_uint,
    pub raw_input_format: c_uint,
    pub raw_output_dptr: u64,
    pub raw_output_pitch: c_uint,
    pub reserved1: c_uint,
    pub output_stream: Stream,
    pub reserved: [c_uint; 46],
    pub histogram_dptr: *mut u64,
    pub reserved2: [*mut c_void; 1],
}
const _: () = assert!(size_of::<ProcParams>() == 264);
const _: () = assert!(offset_of!(ProcParams, raw_input_dptr) == 24);
const _: () = assert!(offset_of!(ProcParams, output_stream) == 56);
const _: () = assert!(offset_of!(ProcParams, reserved) == 64);
const _: () = assert!(offset_of!(ProcParams, histogram_dptr) == 248);

/// A `{ int left, top, right, bottom; }` rectangle.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IntRect {
    pub left: c_int,
    pub top: c_int,
    pub right: c_int,
    pub bottom: c_int,
}

/// `CUVIDEOFORMAT` (`nvcuvid.h`), handed to the sequence callback.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct VideoFormat {
    pub codec: c_uint,
    pub frame_rate_num: c_uint,
    pub frame_rate_den: c_uint,
    pub progressive_sequence: u8,
    pub bit_depth_luma_minus8: u8,
    pub bit_depth_chroma_minus8: u8,
    pub min_num_decode_surfaces: u8,
    pub coded_width: c_uint,
    pub coded_height: c_uint,
    pub display_area: IntRect,
    pub chroma_format: c_uint,
    pub bitrate: c_uint,
    pub display_aspect_x: c_int,
    pub display_aspect_y: c_int,
    /// `video_signal_description`: a bitfield byte then three bytes.
    pub video_signal_description: [u8; 4],
    pub seqhdr_data_length: c_uint,
}
const _: () = assert!(size_of::<VideoFormat>() == 64);
const _: () = assert!(offset_of!(VideoFormat, progressive_sequence) == 12);
const _: () = assert!(offset_of!(VideoFormat, coded_width) == 16);
const _: () = assert!(offset_of!(VideoFormat, display_area) == 24);
const _: () = assert!(offset_of!(VideoFormat, chroma_format) == 40);
const _: () = assert!(offset_of!(VideoFormat, display_aspect_x) == 48);
const _: () = assert!(offset_of!(VideoFormat, video_signal_description) == 56);
const _: () = assert!(offset_of!(VideoFormat, seqhdr_data_length) == 60);

/// `CUVIDSOURCEDATAPACKET` (`nvcuvid.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SourceDataPacket {
    pub flags: c_ulong,
    pub payload_size: c_ulong,
    pub payload: *const u8,
    /// `CUvideotimestamp`, in the parser's clock (`ulClockRate`).
    pub timestamp: i64,
}
const _: () = assert!(size_of::<SourceDataPacket>() == 32);
const _: () = assert!(offset_of!(SourceDataPacket, payload) == 16);
const _: () = assert!(offset_of!(SourceDataPacket, timestamp) == 24);

/// `CUVIDPARSERDISPINFO` (`nvcuvid.h`), handed to the display callback.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ParserDispInfo {
    pub picture_index: c_int,
    pub progressive_frame: c_int,
    pub top_field_first: c_int,
    pub repeat_first_field: c_int,
    pub timestamp: i64,
}
const _: () = assert!(size_of::<ParserDispInfo>() == 24);
const _: () = assert!(offset_of!(ParserDispInfo, timestamp) == 16);

/// `PFNVIDSEQUENCECALLBACK`.
pub type SequenceCallback = unsafe extern "C" fn(*mut c_void, *mut VideoFormat) -> c_int;
/// `PFNVIDDECODECALLBACK`.
pub type DecodeCallback = unsafe extern "C" fn(*mut c_void, *mut PicParams) -> c_int;
/// `PFNVIDDISPLAYCALLBACK`.
pub type DisplayCallback = unsafe extern "C" fn(*mut c_void, *mut ParserDispInfo) -> c_int;

/// `CUVIDPARSERPARAMS` (`nvcuvid.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ParserParams {
    pub codec_type: c_uint,
    pub max_num_decode_surfaces: c_uint,
    pub clock_rate: c_uint,
    pub error_threshold: c_uint,
    pub max_display_delay: c_uint,
    /// `bAnnexb : 1; uReserved : 31;` (AV1 only; zero here).
    pub annexb_bits: c_uint,
    pub reserved1: [c_uint; 4],
    pub user_data: *mut c_void,
    pub sequence_callback: Option<SequenceCallback>,
    pub decode_picture: Option<DecodeCallback>,
    pub display_picture: Option<DisplayCallback>,
    /// `pfnGetOperatingPoint` (AV1; unused).
    pub get_operating_point: *mut c_void,
    /// `pvReserved2` (SDK 12 names one `pfnGetSEIMsg`; unused).
    pub reserved2: [*mut c_void; 6],
    pub ext_video_info: *mut c_void,
}
const _: () = assert!(size_of::<ParserParams>() == 136);
const _: () = assert!(offset_of!(ParserParams, max_display_delay) == 16);
const _: () = assert!(offset_of!(ParserParams, reserved1) == 24);
const _: () = assert!(offset_of!(ParserParams, user_data) == 40);
const _: () = assert!(offset_of!(ParserParams, sequence_callback) == 48);
const _: () = assert!(offset_of!(ParserParams, get_operating_point) == 72);
const _: () = assert!(offset_of!(ParserParams, reserved2) == 80);
const _: () = assert!(offset_of!(ParserParams, ext_video_info) == 128);

/// The entry points, resolved once from `libnvcuvid`.
#[allow(missing_docs)]
pub struct Nvcuvid {
    pub create_video_parser: unsafe extern "C" fn(*mut VideoParser, *mut ParserParams) -> u32,
    pub parse_video_data: unsafe extern "C" fn(VideoParser, *mut SourceDataPacket) -> u32,
    pub destroy_video_parser: unsafe extern "C" fn(VideoParser) -> u32,
    pub get_decoder_caps: unsafe extern "C" fn(*mut DecodeCaps) -> u32,
    pub create_decoder: unsafe extern "C" fn(*mut VideoDecoder, *mut DecodeCreateInfo) -> u32,
    pub decode_picture: unsafe extern "C" fn(VideoDecoder, *mut PicParams) -> u32,
    pub map_video_frame64: unsafe extern "C" fn(VideoDecoder, c_int, *mut u64, *mut c_uint, *mut ProcParams) -> u32,
    pub unmap_video_frame64: unsafe extern "C" fn(VideoDecoder, u64) -> u32,
    pub destroy_decoder: unsafe extern "C" fn(VideoDecoder) -> u32,
    pub ctx_lock_create: unsafe extern "C" fn(*mut CtxLock, Context) -> u32,
    pub ctx_lock_destroy: unsafe extern "C" fn(CtxLock) -> u32,
    /// Keeps the library mapped for as long as the pointers above live.
    _lib: libloading::Library,
}

/// Names tried, in order: the driver's versioned soname, then the
/// development symlink.
const LIBRARY_NAMES: [&str; 2] = ["libnvcuvid.so.1", "libnvcuvid.so"];

impl Nvcuvid {
    /// Opens `libnvcuvid` and resolves every entry point.
    ///
    /// # Errors
    /// A sentence naming what is missing: the library (with the names
    /// tried and the loader's message) or an entry point.
    pub fn load(over: Option<&str>) -> Result<Nvcuvid, String> {
        let mut tried = Vec::new();
        let mut lib = None;
        let names: Vec<&str> = match over {
            Some(v) => vec![v],
            None => LIBRARY_NAMES.to_vec(),
        };
        for name in names {
            // SAFETY: opening the driver's video library runs its
            // initialisers, which only set up the library itself; nothing
            // else in this process depends on it being absent.
            match unsafe { libloading::Library::new(name) } {
                Ok(l) => {
                    lib = Some(l);
                    break;
                }
                Err(e) => tried.push(format!("{name}: {e}")),
            }
        }
        let Some(lib) = lib else {
            return Err(format!(
                "the NVIDIA video decoder library was not found ({}); it ships with the NVIDIA driver: \
                 install the driver's video/decode component, or, in a container, request the \
                 'video' driver capability (NVIDIA_DRIVER_CAPABILITIES=compute,utility,video)",
                tried.join("; ")
            ));
        };
        macro_rules! sym {
            ($name:literal) => {{
                // SAFETY: the field's type is this entry point's prototype in
                // `nvcuvid.h`/`cuviddec.h` with `CUresult` as `u32` and enum
                // parameters as C integers; `lib` is kept in the struct, so it
                // outlives the pointer.
                match unsafe { lib.get($name.as_bytes()) } {
                    Ok(s) => *s,
                    Err(e) => return Err(format!("the NVIDIA video decoder library lacks {}: {e}", $name)),
                }
            }};
        }
        Ok(Nvcuvid {
            create_video_parser: sym!("cuvidCreateVideoParser"),
            parse_video_data: sym!("cuvidParseVideoData"),
            destroy_video_parser: sym!("cuvidDestroyVideoParser"),
            get_decoder_caps: sym!("cuvidGetDecoderCaps"),
            create_decoder: sym!("cuvidCreateDecoder"),
            decode_picture: sym!("cuvidDecodePicture"),
            map_video_frame64: sym!("cuvidMapVideoFrame64"),
            unmap_video_frame64: sym!("cuvidUnmapVideoFrame64"),
            destroy_decoder: sym!("cuvidDestroyDecoder"),
            ctx_lock_create: sym!("cuvidCtxLockCreate"),
            ctx_lock_destroy: sym!("cuvidCtxLockDestroy"),
            _lib: lib,
        })
    }
}

/// `cuMemcpy2DAsync_v2` from the CUDA driver, resolved from the library
/// `cudarc` loaded (the crate's driver layer has no 2-D copy).
pub type Memcpy2DAsync = unsafe extern "C" fn(*const cudarc::driver::sys::CUDA_MEMCPY2D, Stream) -> u32;

const _: () = assert!(size_of::<cudarc::driver::sys::CUDA_MEMCPY2D>() == 128);

/// Resolves `cuMemcpy2DAsync_v2`.
///
/// # Errors
/// A sentence when the CUDA driver library is absent or lacks the call.
pub fn memcpy2d_async() -> Result<Memcpy2DAsync, String> {
    // SAFETY: `is_culib_present` only tries to open the library by name.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err("no CUDA driver library (libcuda.so) was found".into());
    }
    // SAFETY: the library is present (checked above), so `culib` opens it
    // instead of panicking; it stays loaded for the whole process.
    let lib = unsafe { cudarc::driver::sys::culib() };
    // SAFETY: `Memcpy2DAsync` is `cuMemcpy2DAsync_v2`'s prototype in
    // `cuda.h` with `CUresult` as `u32`; the library outlives the pointer.
    match unsafe { lib.get::<Memcpy2DAsync>(b"cuMemcpy2DAsync_v2") } {
        Ok(f) => Ok(*f),
        Err(e) => Err(format!("the CUDA driver lacks cuMemcpy2DAsync_v2: {e}")),
    }
}
