/*
 * vramring.h: the shared-memory layout and socket messages of vramring.
 *
 * Layout version 5 (VR_LAYOUT_VERSION), packet-ring layout version 1
 * (VR_PACKET_LAYOUT_VERSION), socket protocol version 4
 * (VR_PROTOCOL_VERSION). proto/PROTOCOL.md is the prose reference; this
 * header is the byte-exact one. tests/c_layout.rs compiles a program against
 * this header and checks every size, offset and constant against the Rust
 * crate (src/layout.rs, src/format.rs, src/packet/layout.rs,
 * src/socket/msg.rs).
 *
 * Conventions
 *  - Everything is little-endian and fixed-width. No pointers, no bool, no
 *    enums: every code is a uint32_t compared against the constants below.
 *  - Shared-memory structs (vr_ring_* , vr_slot_desc, vr_subs_header,
 *    vr_sub_entry, vr_client_line, vr_packet_*) are declared with plain uint32_t / uint64_t fields. Every
 *    one of those fields MUST be accessed atomically, with the memory order
 *    PROTOCOL.md names (e.g. __atomic_load_n(&h->seq.global_seq,
 *    __ATOMIC_ACQUIRE)); "relaxed" where it says nothing. Never memcpy a
 *    struct out of shared memory and never write a field the protocol does
 *    not give to you.
 *  - Who writes what (since protocol 2): the publisher alone writes the control
 *    region, the subscriber table and the packet region; subscribers map
 *    them read-only (the memfds are sealed VR_READ_ONLY_SEALS and sent as
 *    read-only reopens). A subscriber writes only its own client region
 *    (vr_client_line, one memfd per connection, shared with the publisher
 *    and nobody else), every field of it but `doorbell`.
 *  - The shared structs have no implicit padding: the tail of every
 *    128-byte line is spelled out as a `_pad` array (padding, not reserved:
 *    never read, never written). `reserved*` fields are zero in this version.
 *  - The packet ring (PROTOCOL.md section 17) is served on a socket of its
 *    own with the same messages; its region is vr_packet_header, the
 *    records, then a byte data area. Mask every record index with
 *    (record_count - 1) and every byte position with (data_bytes - 1).
 *  - Message structs (vr_msg_header, vr_hello, vr_welcome, vr_notice,
 *    vr_attach) are packed records of exactly the bytes on the wire. Their
 *    fields are little-endian; on a big-endian host byte-swap them.
 *  - Nothing read from a peer is trusted: validate as PROTOCOL.md section 7
 *    says, mask every slot index with (slot_count - 1), bounds-check every
 *    subscriber index.
 */
#ifndef VRAMRING_H
#define VRAMRING_H

#include <stddef.h>
#include <stdint.h>

#if defined(__cplusplus)
#define VR_STATIC_ASSERT(c, m) static_assert(c, m)
#define VR_ALIGN128 alignas(128)
#define VR_ALIGN64 alignas(64)
#define VR_ALIGNOF(t) alignof(t)
#else
#define VR_STATIC_ASSERT(c, m) _Static_assert(c, m)
#define VR_ALIGN128 _Alignas(128)
#define VR_ALIGN64 _Alignas(64)
#define VR_ALIGNOF(t) _Alignof(t)
#endif

#if defined(__GNUC__) || defined(__clang__)
#define VR_PACKED __attribute__((packed))
#else
#error "vramring.h needs __attribute__((packed)) (GCC or Clang) for the message records"
#endif

/* ======================================================================
 * Shared-memory constants (src/layout.rs)
 * ====================================================================== */

/* Magic of the control region: the bytes "VRAMRING" read as a LE u64. */
#define VR_RING_MAGIC UINT64_C(0x474e49524d415256)
/* Magic of the subscriber table: the bytes "VRSUBTAB" read as a LE u64. */
#define VR_SUBS_MAGIC UINT64_C(0x4241544255535256)
/* Version of the shared layout; also the control region's ready word. */
#define VR_LAYOUT_VERSION 5u

#define VR_MIN_SLOTS 2u                  /* slot_count is a power of two in */
#define VR_MAX_SLOTS 1024u               /* VR_MIN_SLOTS..=VR_MAX_SLOTS      */
#define VR_DEFAULT_MAX_SUBSCRIBERS 64u
#define VR_MAX_SUBSCRIBERS_LIMIT 1024u   /* max_subscribers in 1..=this     */
#define VR_USER_META_WORDS 8u            /* u64 words of user metadata      */
#define VR_USER_META_BYTES 64u
#define VR_NAME_BYTES 32u                /* subscriber name, NUL-padded UTF-8 */
/* Buffers of a latest push subscriber (PROTOCOL.md section 16): one held
 * by the reader, one newest complete, one being written. */
#define VR_PUSH_BUFFERS 3u
/* Buffers of a queued push subscriber (sequential or lossless, version 5):
 * VR_PUSH_QUEUE_MIN..=VR_PUSH_MAX_BUFFERS; also the push_seq words of an
 * entry. */
#define VR_PUSH_QUEUE_MIN 2u
#define VR_PUSH_MAX_BUFFERS 16u

/* Slot seq bit: the slot is being written for the seq in the low 63 bits. */
#define VR_SEQ_WRITING (UINT64_C(1) << 63)

/* vr_ring_info.backend */
#define VR_BACKEND_HOST 1u  /* memfd pool, mmap it                          */
#define VR_BACKEND_CUDA 2u  /* CUDA VMM allocation, POSIX file descriptor   */

/* vr_ring_info.ring_flags (version 4; unknown bits: refuse the ring) */
/* The pool ends with a gate line (CUDA only): the publisher stores every
 * committed seq into the u64 at pool offset slot_count * slot_stride, in
 * device memory, once the frame's bytes are complete (PROTOCOL.md 8.5, 10.1). A
 * queued pull waits on it with cuStreamWaitValue64 (ADR 0011). */
#define VR_RING_GATE 1u
#define VR_RING_FLAGS_KNOWN 1u
#define VR_GATE_BYTES 64u  /* bytes of the gate line; pool_bytes holds them */

/* vr_ring_info.policy */
#define VR_POLICY_OVERWRITE 0u /* the producer never waits                  */
#define VR_POLICY_LOSSLESS 1u  /* the producer waits for lossless readers   */

/* vr_producer_line.state */
#define VR_PRODUCER_INIT 0u
#define VR_PRODUCER_LIVE 1u
#define VR_PRODUCER_CLOSED 2u  /* closed in order; no more frames           */

/* vr_sub_entry.state */
#define VR_SUB_FREE 0u
#define VR_SUB_ACTIVE 1u
#define VR_SUB_EVICTED 2u

/* vr_sub_entry.evict_code (and the Evicted notice's code): why the entry was
 * evicted; 0 while it never was since its assignment. */
#define VR_EVICT_LEASE 16u    /* held a frame or packet past the lossless lease */
#define VR_EVICT_PUSH 17u     /* its push buffers could not be mapped           */
#define VR_EVICT_PROTOCOL 18u /* broke the protocol: a message other than Bye
                                 after the Welcome, a second Attach, or push
                                 buffers that do not fit the ring            */

/* vr_sub_entry.flags */
#define VR_SUBF_LOSSLESS 1u
#define VR_SUBF_SEQUENTIAL 2u
#define VR_SUBF_WRITE 4u
#define VR_SUBF_PUSH 8u     /* push delivery granted (PROTOCOL.md section 16) */

/* vr_slot_desc.flags (set by the producing application) */
#define VR_FRAME_KEY 1u
#define VR_FRAME_DISCONTINUITY 2u

/* ======================================================================
 * Formats and plane layout (src/format.rs)
 * ====================================================================== */

#define VR_PITCH_ALIGN 512u             /* every plane pitch % this == 0     */
#define VR_PLANE_ALIGN 4096u            /* every plane offset % this == 0    */
#define VR_SLOT_ALIGN 65536u            /* slot_stride % this == 0           */
#define VR_MAX_PLANES 4u
#define VR_MAX_DIMENSION 16384u         /* largest width / height (not raw)  */
#define VR_MAX_RAW_BYTES (1u << 30)     /* largest raw frame                 */

/* vr_ring_info.format */
#define VR_FORMAT_RAW 1u   /* opaque bytes: width = byte length, height = 1 */
#define VR_FORMAT_GRAY8 2u
#define VR_FORMAT_NV12 3u  /* Y plane, then interleaved UV plane            */
#define VR_FORMAT_P010 4u  /* as NV12 in 16-bit little-endian words         */
#define VR_FORMAT_RGB8 5u
#define VR_FORMAT_RGBA8 6u

/* memfd seals (F_SEAL_* of <fcntl.h>) a subscriber must find on the
 * descriptors of a Welcome. */
#define VR_F_SEAL_SEAL 0x0001u
#define VR_F_SEAL_SHRINK 0x0002u
#define VR_F_SEAL_GROW 0x0004u
#define VR_F_SEAL_FUTURE_WRITE 0x0010u
/* A region only the publisher writes: nobody can make a new writable
 * mapping, write(), fallocate() or resize it; the publisher keeps the
 * writable mapping it made before sealing. */
#define VR_READ_ONLY_SEALS (VR_F_SEAL_SHRINK | VR_F_SEAL_GROW | VR_F_SEAL_FUTURE_WRITE | VR_F_SEAL_SEAL)
/* A region of fixed size that its holders may write. */
#define VR_FIXED_SIZE_SEALS (VR_F_SEAL_SHRINK | VR_F_SEAL_GROW | VR_F_SEAL_SEAL)
#define VR_CONTROL_SEALS VR_READ_ONLY_SEALS   /* fd 0: control region          */
#define VR_SUBS_SEALS VR_READ_ONLY_SEALS      /* fd 1: subscriber table        */
#define VR_CLIENT_SEALS VR_FIXED_SIZE_SEALS   /* fd 2: own client region       */
/* Seals a subscriber requires on a host pool (fd 3). The publisher applies
 * VR_READ_ONLY_SEALS, or VR_FIXED_SIZE_SEALS when it grants write access to
 * anyone (PROTOCOL.md section 8.3). */
#define VR_HOST_POOL_SEALS (VR_F_SEAL_SHRINK)
/* Seals the publisher requires on the memfd of a host-backend Attach (the
 * Rust subscriber applies SHRINK | GROW | SEAL). */
#define VR_PUSH_HOST_SEALS (VR_F_SEAL_SHRINK)

/* ======================================================================
 * Shared-memory structs
 *
 * Control region (memfd #0 of a Welcome, mapped read-only):
 *     vr_ring_header                  at 0
 *     vr_slot_desc[slot_count]        at sizeof(vr_ring_header) = 640
 *     total VR_CONTROL_BYTES(slot_count)
 * Subscriber table (memfd #1, mapped read-only; publisher-written):
 *     vr_subs_header                  at 0
 *     vr_sub_entry[max_subscribers]   at sizeof(vr_subs_header) = 256
 *     total VR_SUBS_BYTES(max_subscribers)
 * Client region (memfd #2, this connection's own, mapped read-write):
 *     vr_client_line                  at 0
 *     total VR_CLIENT_BYTES = 128
 * ====================================================================== */

/* Immutable description of the ring. The publisher writes every field, then
 * stores layout_version (SYNC: ring-ready, Release). A reader loads
 * layout_version with Acquire first, then everything else. */
typedef struct vr_ring_info {
    VR_ALIGN128 uint64_t magic;     /*   0 VR_RING_MAGIC                         */
    uint32_t layout_version;        /*   8 VR_LAYOUT_VERSION; 0 until ready      */
    uint32_t header_bytes;          /*  12 sizeof(vr_ring_header) = 640          */
    uint64_t control_bytes;         /*  16 bytes of the whole control region    */
    uint64_t epoch;                 /*  24 random per publisher instance         */
    uint32_t slot_count;            /*  32 power of two                          */
    uint32_t slot_desc_bytes;       /*  36 sizeof(vr_slot_desc) = 128            */
    uint64_t slots_offset;          /*  40 offset of slot descriptor 0 = 640     */
    uint32_t backend;               /*  48 VR_BACKEND_*                          */
    uint32_t format;                /*  52 VR_FORMAT_*                           */
    uint32_t width;                 /*  56 pixels (bytes for RAW)                */
    uint32_t height;                /*  60 rows (1 for RAW)                      */
    uint32_t plane_count;           /*  64 planes in use                         */
    uint32_t policy;                /*  68 VR_POLICY_*                           */
    uint64_t plane_offset[4];       /*  72 byte offset of each plane in a slot   */
    uint64_t plane_pitch[4];        /* 104 bytes from row to row                 */
    uint64_t plane_rows[4];         /* 136 rows of each plane                    */
    uint64_t plane_row_bytes[4];    /* 168 pixel bytes per row                   */
    uint64_t frame_bytes;           /* 200 slot start to end of the last plane   */
    uint64_t slot_stride;           /* 208 bytes between slots in the pool       */
    uint64_t pool_bytes;            /* 216 bytes of the pool allocation          */
    uint64_t device_uuid[2];        /* 224 GPU UUID bytes 0..7, 8..15 (LE); 0 host */
    uint32_t max_subscribers;       /* 240 entries in the subscriber table       */
    uint32_t ring_flags;            /* 244 VR_RING_* (v4; zero before)           */
    uint64_t created_realtime_ns;   /* 248 CLOCK_REALTIME at creation            */
} vr_ring_info;

/* Producer state, written only by the publisher. */
typedef struct vr_producer_line {
    VR_ALIGN128 uint32_t state;     /*   0 VR_PRODUCER_*; SYNC: producer-state   */
    uint32_t reserved0;             /*   4 zero                                  */
    uint64_t heartbeat_ns;          /*   8 CLOCK_MONOTONIC of last publish/tick  */
    uint64_t published;             /*  16 frames published (== global_seq)      */
    uint64_t evictions;             /*  24 lossless subscribers evicted          */
    uint64_t connects;              /*  32 subscribers connected so far          */
    uint64_t disconnects;           /*  40 subscribers disconnected so far       */
    uint8_t _pad[80];               /*  48 padding to the 128-byte line          */
} vr_producer_line;

/* The newest committed seq, alone on its line. */
typedef struct vr_seq_line {
    VR_ALIGN128 uint64_t global_seq; /*  0 0 = none yet; SYNC: global-seq (the GPU may store it: stream-order commit) */
    uint64_t pending_seq;           /*   8 newest commit enqueued; > global_seq: in flight. SYNC: pending */
    uint8_t _pad[112];
} vr_seq_line;

/* Reserved (zero) since protocol 2: every subscriber parks on the doorbell
 * of its own vr_client_line, which no other subscriber can reach. (In
 * protocol 1 this was the one futex word all subscribers shared.) */
typedef struct vr_doorbell_line {
    VR_ALIGN128 uint32_t reserved;  /*   0 zero                                  */
    uint8_t _pad[124];
} vr_doorbell_line;

/* The head of the control region. */
typedef struct vr_ring_header {
    vr_ring_info info;              /*   0 */
    vr_producer_line producer;      /* 256 */
    vr_seq_line seq;                /* 384 */
    vr_doorbell_line doorbell;      /* 512 reserved (zero)                   */
} vr_ring_header;                   /* 640 */

/* One slot's descriptor; slot of seq s is s & (slot_count - 1). Written only
 * by the publisher, under the seqlock rule (PROTOCOL.md sections 9-11). */
typedef struct vr_slot_desc {
    VR_ALIGN128 uint64_t seq;       /*   0 s; s|VR_SEQ_WRITING while written; 0 never. SYNC: slot-seq, invalidate */
    uint64_t pts;                   /*   8 presentation timestamp (int64 bits)   */
    uint64_t commit_ns;             /*  16 CLOCK_MONOTONIC at commit             */
    uint32_t flags;                 /*  24 VR_FRAME_*                            */
    uint32_t user_len;              /*  28 bytes of user[] in use (clamp to 64)  */
    uint64_t reserved[2];           /*  32 zero                                  */
    uint64_t user[8];               /*  48 user metadata, bytes in LE word order */
    uint64_t reserved2[2];          /* 112 zero                                  */
} vr_slot_desc;                     /* 128 */

/* The head of the subscriber table. */
typedef struct vr_subs_header {
    VR_ALIGN128 uint64_t magic;     /*   0 VR_SUBS_MAGIC                         */
    uint32_t layout_version;        /*   8 VR_LAYOUT_VERSION; 0 until ready (SYNC: subs-ready) */
    uint32_t max_subscribers;       /*  12 entries (== ring's max_subscribers)   */
    uint64_t epoch;                 /*  16 == ring's epoch                       */
    uint32_t entry_bytes;           /*  24 sizeof(vr_sub_entry) = 256            */
    uint32_t entries_offset;        /*  28 sizeof(vr_subs_header) = 256          */
    uint64_t reserved[28];          /*  32 zero                                  */
} vr_subs_header;                   /* 256 */

/* One subscriber's entry. Written by the publisher alone; a
 * subscriber maps the table read-only and reads its own entry: its lease
 * holds while state == VR_SUB_ACTIVE and generation == its Welcome's. The
 * counters are the publisher's copies of what the subscriber reported in its
 * client region (informational, the subscriber's own claims). */
typedef struct vr_sub_entry {
    VR_ALIGN128 uint32_t state;     /*   0 VR_SUB_*; SYNC: sub-state             */
    uint32_t flags;                 /*   4 VR_SUBF_*                             */
    uint32_t generation;            /*   8 +1 per assignment                     */
    uint32_t push_count;            /*  12 buffers attached once the publisher mapped
                                     them (VR_PUSH_BUFFERS, or a queue of
                                     VR_PUSH_QUEUE_MIN..=VR_PUSH_MAX_BUFFERS), 0
                                     otherwise. SYNC: push-seq */
    uint32_t evict_code;            /*  16 VR_EVICT_* of the last eviction (stored
                                     before VR_SUB_EVICTED, kept after the free),
                                     0 from the next assignment                */
    uint32_t reserved0;             /*  20 zero                                  */
    uint64_t released_seq;          /*  24 the publisher's view of the lossless
                                     cursor: the client's released_seq clamped to
                                     what was published, never moving back     */
    uint64_t delivered;             /*  32 copy of the client's delivered        */
    uint64_t dropped;               /*  40 copy of the client's dropped          */
    uint64_t overruns;              /*  48 copy of the client's overruns         */
    uint64_t heartbeat_ns;          /*  56 copy of the client's heartbeat_ns     */
    uint64_t name[4];               /*  64 the Hello's name, NUL-padded UTF-8, LE word order */
    /* Push delivery (PROTOCOL.md section 16); all zero while not in use. */
    uint64_t push_seq[VR_PUSH_MAX_BUFFERS]; /*  96 seq in push buffer k < push_count;
                                     seq|VR_SEQ_WRITING while claimed/written;
                                     0 empty. SYNC: push-seq, push-hold */
    uint64_t reserved1[4];          /* 224 zero                                  */
} vr_sub_entry;                     /* 256 */

/* A subscriber's own region: one memfd per connection, sealed
 * VR_CLIENT_SEALS, mapped read-write by that subscriber and the publisher
 * only. The subscriber writes every field but doorbell; the publisher treats
 * every value here as hostile (released_seq clamped to the newest published
 * seq and never moving back, push_held only compared, parked only costs this
 * subscriber's own wake-up, counters copied for inspection). A reused table
 * entry gets a new client region. */
typedef struct vr_client_line {
    VR_ALIGN128 uint32_t doorbell;  /*   0 the futex word this subscriber parks on;
                                     incremented by the publisher. SYNC: doorbell */
    uint32_t parked;                /*   4 !=0 while parked (or about to park). SYNC: park */
    uint32_t push_held;             /*   8 push: k + 1 while holding buffer k, 0 none.
                                     SYNC: push-hold */
    uint32_t reserved0;             /*  12 zero                                  */
    uint64_t released_seq;          /*  16 lossless cursor: newest seq done with;
                                     set by the publisher before the Welcome.
                                     SYNC: release-cursor */
    uint64_t reading_seq;           /*  24 seq being read, 0 none (informational) */
    uint64_t delivered;             /*  32 frames/packets handed to the user     */
    uint64_t dropped;               /*  40 frames/packets skipped (gaps)         */
    uint64_t overruns;              /*  48 reads discarded by validate-after-copy */
    uint64_t heartbeat_ns;          /*  56 CLOCK_MONOTONIC of the last read      */
    uint64_t reserved1[8];          /*  64 zero                                  */
} vr_client_line;                   /* 128 */

/* Bytes of a client region (the Welcome's client_bytes). */
#define VR_CLIENT_BYTES 128u

/* Byte sizes of the two regions. */
#define VR_CONTROL_BYTES(slot_count) \
    ((uint64_t)sizeof(vr_ring_header) + (uint64_t)(slot_count) * (uint64_t)sizeof(vr_slot_desc))
#define VR_SUBS_BYTES(max_subscribers) \
    ((uint64_t)sizeof(vr_subs_header) + (uint64_t)(max_subscribers) * (uint64_t)sizeof(vr_sub_entry))

/* ======================================================================
 * Packet ring (src/packet/layout.rs; PROTOCOL.md section 17): encoded
 * video (H.264/H.265 access units) as variable-length packets in a byte
 * ring, served on its own socket.
 *
 * Packet region (memfd #0 of a packet Welcome, mapped read-only):
 *     vr_packet_header                  at 0
 *     vr_packet_record[record_count]    at sizeof(vr_packet_header) = 4864
 *     data area (data_bytes bytes)      at VR_PACKET_DATA_OFFSET(record_count)
 *     total VR_PACKET_REGION_BYTES(record_count, data_bytes)
 * Subscriber table (memfd #1, mapped read-only) and client region (memfd
 * #2, mapped read-write): as the frame ring's.
 *
 * Byte positions are free-running uint64_t; position p lives at
 * data_offset + (p & (data_bytes - 1)). A packet never wraps: one that does
 * not fit before the end of the data area starts at the next multiple of
 * data_bytes (the skipped bytes are padding). Seq s has record
 * s & (record_count - 1).
 * ====================================================================== */

/* Magic of the packet region: the bytes "VRPACKET" read as a LE u64. */
#define VR_PACKET_MAGIC UINT64_C(0x54454b4341505256)
/* Version of the packet-ring layout; also the region's ready word. */
#define VR_PACKET_LAYOUT_VERSION 1u

#define VR_PACKET_PARAMS_BYTES 4096u      /* codec-parameters area             */
#define VR_PACKET_PARAMS_WORDS 512u       /* ... in u64 words                  */
#define VR_PACKET_MIN_RECORDS 2u          /* record_count is a power of two in */
#define VR_PACKET_MAX_RECORDS (1u << 20)  /* MIN..=MAX                         */
#define VR_PACKET_MIN_DATA_BYTES UINT64_C(4096)          /* data_bytes is a power */
#define VR_PACKET_MAX_DATA_BYTES (UINT64_C(1) << 32)     /* of two in MIN..=MAX   */
#define VR_PACKET_DATA_ALIGN UINT64_C(4096) /* data_offset % this == 0          */

/* vr_packet_record.flags */
#define VR_PACKET_KEY 1u            /* keyframe (IDR / IRAP): a decoder can start here */
#define VR_PACKET_DISCONTINUITY 2u  /* a discontinuity precedes this packet         */

/* Record and params seq bit: being written for the seq in the low 63 bits. */
#define VR_PACKET_WRITING (UINT64_C(1) << 63)

/* Seals a subscriber must find on the packet region's memfd (fd 0 of a
 * packet Welcome); the subscriber table (fd 1) carries VR_SUBS_SEALS, the
 * client region (fd 2) VR_CLIENT_SEALS. */
#define VR_PACKET_RING_SEALS VR_CONTROL_SEALS

/* Immutable description. The writer stores every field, then layout_version
 * (SYNC: packet-ready, Release); a reader loads layout_version with Acquire
 * first. */
typedef struct vr_packet_info {
    VR_ALIGN128 uint64_t magic;     /*   0 VR_PACKET_MAGIC                       */
    uint32_t layout_version;        /*   8 VR_PACKET_LAYOUT_VERSION; 0 until ready */
    uint32_t header_bytes;          /*  12 sizeof(vr_packet_header) = 4864       */
    uint64_t region_bytes;          /*  16 bytes of the whole packet region      */
    uint64_t epoch;                 /*  24 random per writer instance            */
    uint64_t data_offset;           /*  32 VR_PACKET_DATA_OFFSET(record_count)   */
    uint64_t data_bytes;            /*  40 power of two                          */
    uint64_t records_offset;        /*  48 offset of record 0 = 4864             */
    uint32_t record_count;          /*  56 power of two                          */
    uint32_t record_bytes;          /*  60 sizeof(vr_packet_record) = 64         */
    uint32_t max_packet;            /*  64 largest packet; 2*max_packet <= data_bytes */
    uint32_t codec;                 /*  68 stream codec (application code, e.g. a FourCC) */
    uint32_t params_capacity;       /*  72 VR_PACKET_PARAMS_BYTES                */
    uint32_t reserved0;             /*  76 zero                                  */
    uint64_t reserved[6];           /*  80 zero                                  */
} vr_packet_info;                   /* 128 */

/* The newest committed packet, alone on its line (readers poll it). */
typedef struct vr_packet_seq_line {
    VR_ALIGN128 uint64_t write_seq; /*   0 0 = none yet; SYNC: packet-write-seq  */
    uint8_t _pad[120];
} vr_packet_seq_line;

/* Byte-ring positions and the newest keyframe. */
typedef struct vr_packet_tail_line {
    VR_ALIGN128 uint64_t tail;      /*   0 lowest byte position still intact; raised
                                     before lower bytes are overwritten. SYNC: packet-tail */
    uint64_t head;                  /*   8 position after the newest packet (informational) */
    uint64_t keyframe_seq;          /*  16 newest committed keyframe, 0 none; SYNC: packet-keyframe */
    uint8_t _pad[104];              /*  24 padding to the 128-byte line          */
} vr_packet_tail_line;

/* Codec parameters (SPS/PPS/VPS or extradata) under their own seqlock. */
typedef struct vr_packet_params {
    VR_ALIGN128 uint64_t seq;       /*   0 version v, 0 never set; v|VR_PACKET_WRITING
                                     while rewritten. SYNC: params-seq        */
    uint32_t len;                   /*   8 bytes in use, <= VR_PACKET_PARAMS_BYTES */
    uint32_t reserved0;             /*  12 zero                                  */
    uint64_t reserved[14];          /*  16 zero                                  */
    uint64_t data[VR_PACKET_PARAMS_WORDS]; /* 128 the bytes, in LE word order    */
} vr_packet_params;                 /* 4224 */

/* The head of the packet region. producer and doorbell are the frame
 * ring's line structs, with the same meaning (producer.published counts
 * packets: == write_seq; doorbell is reserved, zero: readers park on their
 * own vr_client_line). */
typedef struct vr_packet_header {
    vr_packet_info info;            /*    0 */
    vr_packet_seq_line seq;         /*  128 */
    vr_packet_tail_line tail;       /*  256 */
    vr_producer_line producer;      /*  384 SYNC: producer-state                 */
    vr_doorbell_line doorbell;      /*  512 reserved (zero)                      */
    vr_packet_params params;        /*  640 */
} vr_packet_header;                 /* 4864 */

/* One packet's record; seq s has record s & (record_count - 1). Written only
 * by the writer, under the seqlock rule (PROTOCOL.md section 17.6). */
typedef struct vr_packet_record {
    VR_ALIGN64 uint64_t seq;        /*   0 s; s|VR_PACKET_WRITING while written; 0 never.
                                     SYNC: packet-record                      */
    uint64_t offset;                /*   8 free-running position of the first byte;
                                     contiguous at offset & (data_bytes - 1)   */
    uint32_t len;                   /*  16 bytes of the packet (<= max_packet)   */
    uint32_t flags;                 /*  20 VR_PACKET_*                           */
    uint64_t pts;                   /*  24 presentation timestamp (int64 bits)   */
    uint64_t dts;                   /*  32 decode timestamp (int64 bits)         */
    uint32_t codec;                 /*  40 codec of this packet                  */
    uint32_t reserved0;             /*  44 zero                                  */
    uint64_t commit_ns;             /*  48 CLOCK_MONOTONIC at commit             */
    uint64_t reserved;              /*  56 zero                                  */
} vr_packet_record;                 /* 64 */

/* Byte offset of the data area and bytes of the packet region. */
#define VR_PACKET_DATA_OFFSET(record_count)                                              \
    (((uint64_t)sizeof(vr_packet_header) + (uint64_t)(record_count) * (uint64_t)sizeof(vr_packet_record) + \
      VR_PACKET_DATA_ALIGN - 1) & ~(VR_PACKET_DATA_ALIGN - 1))
#define VR_PACKET_REGION_BYTES(record_count, data_bytes) \
    (VR_PACKET_DATA_OFFSET(record_count) + (uint64_t)(data_bytes))

/* ======================================================================
 * Socket messages (src/socket/msg.rs): one record per SOCK_SEQPACKET
 * datagram, little-endian, packed.
 * ====================================================================== */

#define VR_PROTOCOL_VERSION 4u
/* Magic of every message: the bytes "VRSK" read as a LE u32. */
#define VR_MSG_MAGIC 0x4b535256u
#define VR_HEADER_BYTES 16u
#define VR_MAX_MSG_BYTES 256u     /* largest datagram sent or accepted        */
#define VR_MAX_FDS 4u             /* most descriptors one datagram carries    */
#define VR_MSG_NAME_BYTES 32u
#define VR_REASON_BYTES 120u

/* vr_msg_header.kind */
#define VR_KIND_HELLO 1u    /* subscriber -> publisher, first message          */
#define VR_KIND_WELCOME 2u  /* publisher -> subscriber, with exactly 4 fds
                               (frame ring, pull), 3 (frame ring, push) or 3
                               (packet ring)                                   */
#define VR_KIND_REJECT 3u   /* publisher -> subscriber, then close             */
#define VR_KIND_EVICTED 4u  /* publisher -> subscriber, then close             */
#define VR_KIND_BYE 5u      /* either side, header only                        */
#define VR_KIND_ATTACH 6u   /* subscriber -> publisher, with exactly 1 fd, at
                               most once, only after a Welcome that granted
                               VR_HELLO_PUSH                                   */

/* vr_hello.flags (asked) and vr_welcome.granted (granted). A publisher
 * ignores bits it does not know and leaves them out of granted: compare
 * granted with what was asked (PROTOCOL.md section 3.2). */
#define VR_HELLO_LOSSLESS 1u
#define VR_HELLO_SEQUENTIAL 2u
#define VR_HELLO_WRITE 4u
#define VR_HELLO_PUSH 8u    /* push delivery (any read mode, not with WRITE;
                               section 16)                                     */
#define VR_HELLO_PACKETS 16u /* a packet ring, not a frame ring (section 17); a
                               publisher of the other kind answers VR_REJECT_KIND */
#define VR_HELLO_PUSH_OK 32u /* asked only (protocol 4): push is acceptable where
                               pull is refused; the Welcome then grants
                               VR_HELLO_PUSH. Never in granted.                 */

/* vr_hello.backends: one bit per importable backend */
#define VR_BACKEND_BIT(backend) (1u << (backend))

/* vr_notice.code: Reject codes, then Evicted codes */
#define VR_REJECT_VERSION 1u
#define VR_REJECT_PERMISSION 2u
#define VR_REJECT_FULL 3u
#define VR_REJECT_BACKEND 4u
#define VR_REJECT_POLICY 5u
#define VR_REJECT_BAD_HELLO 6u
#define VR_REJECT_SHUTDOWN 7u   /* reserved: no publisher of this protocol sends it */
#define VR_REJECT_WRITE_DENIED 8u
#define VR_REJECT_KIND 9u   /* the socket serves the other kind of ring (frames
                               vs packets: VR_HELLO_PACKETS)                    */
#define VR_REJECT_PULL_DENIED 10u /* pull delivery (the pool's descriptor) is not
                               granted to this peer: ask for VR_HELLO_PUSH      */
#define VR_REJECT_LOSSLESS_BACKOFF 11u /* lossless refused to this uid for a while:
                               a lossless reader of it was evicted for the
                               lease; connect without VR_HELLO_LOSSLESS or
                               retry after the time in the reason          */
/* Evicted codes: VR_EVICT_LEASE, VR_EVICT_PUSH, VR_EVICT_PROTOCOL (above). */
#define VR_EVICT_ATTACH VR_EVICT_PUSH /* older name of VR_EVICT_PUSH         */

#define VR_HELLO_BODY_BYTES 96u
#define VR_WELCOME_BODY_BYTES 96u
#define VR_NOTICE_BODY_BYTES 128u
#define VR_BYE_BODY_BYTES 0u
#define VR_ATTACH_BODY_BYTES 24u

typedef struct VR_PACKED vr_msg_header {
    uint32_t magic;                 /*  0 VR_MSG_MAGIC                          */
    uint32_t version;               /*  4 sender's VR_PROTOCOL_VERSION          */
    uint32_t kind;                  /*  8 VR_KIND_*                             */
    uint32_t body_len;              /* 12 datagram length - 16                  */
} vr_msg_header;

/* Subscriber -> publisher. */
typedef struct VR_PACKED vr_hello {
    vr_msg_header hdr;              /*  0 kind VR_KIND_HELLO, body_len 96        */
    uint32_t flags;                 /* 16 VR_HELLO_*                             */
    uint32_t backends;              /* 20 OR of VR_BACKEND_BIT(VR_BACKEND_*)     */
    uint8_t name[32];               /* 24 UTF-8, NUL-padded, no control chars    */
    uint8_t device_uuid[16];        /* 56 GPU the subscriber uses, 0 = any/none  */
    uint8_t reserved[40];           /* 72 zero                                   */
} vr_hello;                         /* 112 */

/* Publisher -> subscriber, with SCM_RIGHTS fds: [0] control memfd
 * (read-only reopen, VR_CONTROL_SEALS), [1] subscriber-table memfd
 * (read-only reopen, VR_SUBS_SEALS), [2] this connection's client-region
 * memfd (read-write, VR_CLIENT_SEALS), and for a pull subscriber [3] the pool
 * (host: a read-only reopen of the memfd unless write was granted; CUDA: the
 * VMM allocation's POSIX fd). A push subscriber receives no pool: 3 fds. A
 * packet ring's Welcome (granted has VR_HELLO_PACKETS) carries 3: [0]
 * packet-region memfd (read-only reopen), [1] subscriber table, [2] client
 * region; control_bytes is then the packet region's region_bytes, backend
 * VR_BACKEND_HOST, pool_bytes 0. */
typedef struct VR_PACKED vr_welcome {
    vr_msg_header hdr;              /*  0 kind VR_KIND_WELCOME, body_len 96      */
    uint32_t index;                 /* 16 our entry in the subscriber table      */
    uint32_t generation;            /* 20 that entry's generation                */
    uint64_t epoch;                 /* 24 publisher instance                     */
    uint32_t backend;               /* 32 VR_BACKEND_*                           */
    uint32_t granted;               /* 36 VR_HELLO_* granted                     */
    uint64_t control_bytes;         /* 40 bytes to map of fd[0]                  */
    uint64_t subs_bytes;            /* 48 bytes to map of fd[1]                  */
    uint64_t pool_bytes;            /* 56 bytes to map of the pool (fd[3])       */
    uint8_t device_uuid[16];        /* 64 GPU of the pool, 0 for host            */
    uint64_t client_bytes;          /* 80 bytes of fd[2]; == VR_CLIENT_BYTES     */
    uint8_t reserved[24];           /* 88 zero                                   */
} vr_welcome;                       /* 112 */

/* Reject (kind 3) or Evicted (kind 4). The layout of Reject never changes
 * between protocol versions, so a version mismatch can always be reported. */
typedef struct VR_PACKED vr_notice {
    vr_msg_header hdr;              /*  0 kind VR_KIND_REJECT/EVICTED, body_len 128 */
    uint32_t code;                  /* 16 VR_REJECT_* / VR_EVICT_*               */
    uint32_t reserved;              /* 20 zero                                   */
    uint8_t reason[120];            /* 24 UTF-8, NUL-padded                      */
} vr_notice;                        /* 144 */

/* Bye (kind 5) is a bare vr_msg_header with body_len 0. */

/* Subscriber -> publisher, once, after a Welcome that granted VR_HELLO_PUSH,
 * with SCM_RIGHTS fd [0]: the subscriber's own push buffers (host: a memfd
 * sealed at least VR_PUSH_HOST_SEALS; CUDA: a VMM allocation on the ring's
 * GPU exported as a POSIX fd). Buffer k starts at byte k * stride. */
/* The most an Attach's bytes may exceed count * stride (a CUDA allocation
 * is rounded up to its granularity, 2 MiB on current GPUs). */
#define VR_MAX_GRANULARITY (UINT64_C(32) << 20)

typedef struct VR_PACKED vr_attach {
    vr_msg_header hdr;              /*  0 kind VR_KIND_ATTACH, body_len 24       */
    uint32_t count;                 /* 16 buffers; must be VR_PUSH_BUFFERS       */
    uint32_t reserved;              /* 20 zero                                   */
    uint64_t stride;                /* 24 bytes between buffers; must be
                                     round_up(frame_bytes, VR_SLOT_ALIGN)      */
    uint64_t bytes;                 /* 32 bytes of the allocation, in
                                     count*stride ..= count*stride + VR_MAX_GRANULARITY */
} vr_attach;                        /* 40 */

/* ======================================================================
 * Compile-time checks
 * ====================================================================== */

VR_STATIC_ASSERT(sizeof(vr_ring_info) == 256, "vr_ring_info size");
VR_STATIC_ASSERT(offsetof(vr_ring_info, layout_version) == 8, "layout_version");
VR_STATIC_ASSERT(offsetof(vr_ring_info, header_bytes) == 12, "header_bytes");
VR_STATIC_ASSERT(offsetof(vr_ring_info, control_bytes) == 16, "control_bytes");
VR_STATIC_ASSERT(offsetof(vr_ring_info, epoch) == 24, "epoch");
VR_STATIC_ASSERT(offsetof(vr_ring_info, slot_count) == 32, "slot_count");
VR_STATIC_ASSERT(offsetof(vr_ring_info, slots_offset) == 40, "slots_offset");
VR_STATIC_ASSERT(offsetof(vr_ring_info, backend) == 48, "backend");
VR_STATIC_ASSERT(offsetof(vr_ring_info, policy) == 68, "policy");
VR_STATIC_ASSERT(offsetof(vr_ring_info, plane_offset) == 72, "plane_offset");
VR_STATIC_ASSERT(offsetof(vr_ring_info, plane_pitch) == 104, "plane_pitch");
VR_STATIC_ASSERT(offsetof(vr_ring_info, plane_rows) == 136, "plane_rows");
VR_STATIC_ASSERT(offsetof(vr_ring_info, plane_row_bytes) == 168, "plane_row_bytes");
VR_STATIC_ASSERT(offsetof(vr_ring_info, frame_bytes) == 200, "frame_bytes");
VR_STATIC_ASSERT(offsetof(vr_ring_info, slot_stride) == 208, "slot_stride");
VR_STATIC_ASSERT(offsetof(vr_ring_info, pool_bytes) == 216, "pool_bytes");
VR_STATIC_ASSERT(offsetof(vr_ring_info, device_uuid) == 224, "device_uuid");
VR_STATIC_ASSERT(offsetof(vr_ring_info, max_subscribers) == 240, "max_subscribers");
VR_STATIC_ASSERT(offsetof(vr_ring_info, created_realtime_ns) == 248, "created_realtime_ns");
VR_STATIC_ASSERT(sizeof(vr_producer_line) == 128, "vr_producer_line size");
VR_STATIC_ASSERT(offsetof(vr_producer_line, heartbeat_ns) == 8, "heartbeat_ns");
VR_STATIC_ASSERT(offsetof(vr_producer_line, disconnects) == 40, "disconnects");
VR_STATIC_ASSERT(sizeof(vr_seq_line) == 128, "vr_seq_line size");
VR_STATIC_ASSERT(offsetof(vr_seq_line, pending_seq) == 8, "pending_seq");
VR_STATIC_ASSERT(sizeof(vr_doorbell_line) == 128, "vr_doorbell_line size");
VR_STATIC_ASSERT(sizeof(vr_ring_header) == 640, "vr_ring_header size");
VR_STATIC_ASSERT(VR_ALIGNOF(vr_ring_header) == 128, "vr_ring_header align");
VR_STATIC_ASSERT(offsetof(vr_ring_header, producer) == 256, "producer");
VR_STATIC_ASSERT(offsetof(vr_ring_header, seq) == 384, "seq");
VR_STATIC_ASSERT(offsetof(vr_ring_header, doorbell) == 512, "doorbell");
VR_STATIC_ASSERT(sizeof(vr_slot_desc) == 128, "vr_slot_desc size");
VR_STATIC_ASSERT(VR_ALIGNOF(vr_slot_desc) == 128, "vr_slot_desc align");
VR_STATIC_ASSERT(offsetof(vr_slot_desc, flags) == 24, "slot flags");
VR_STATIC_ASSERT(offsetof(vr_slot_desc, user) == 48, "slot user");
VR_STATIC_ASSERT(offsetof(vr_slot_desc, reserved2) == 112, "slot reserved2");
VR_STATIC_ASSERT(sizeof(vr_subs_header) == 256, "vr_subs_header size");
VR_STATIC_ASSERT(offsetof(vr_subs_header, epoch) == 16, "subs epoch");
VR_STATIC_ASSERT(offsetof(vr_subs_header, entries_offset) == 28, "entries_offset");
VR_STATIC_ASSERT(sizeof(vr_sub_entry) == 256, "vr_sub_entry size");
VR_STATIC_ASSERT(VR_ALIGNOF(vr_sub_entry) == 128, "vr_sub_entry align");
VR_STATIC_ASSERT(offsetof(vr_sub_entry, push_count) == 12, "sub push_count");
VR_STATIC_ASSERT(offsetof(vr_sub_entry, evict_code) == 16, "sub evict_code");
VR_STATIC_ASSERT(offsetof(vr_sub_entry, released_seq) == 24, "sub released_seq");
VR_STATIC_ASSERT(offsetof(vr_sub_entry, heartbeat_ns) == 56, "sub heartbeat_ns");
VR_STATIC_ASSERT(offsetof(vr_sub_entry, name) == 64, "sub name");
VR_STATIC_ASSERT(offsetof(vr_sub_entry, push_seq) == 96, "sub push_seq");
VR_STATIC_ASSERT(sizeof(((vr_sub_entry *)0)->push_seq) == 128, "sub push_seq size");
VR_STATIC_ASSERT(offsetof(vr_sub_entry, reserved1) == 224, "sub reserved1");
VR_STATIC_ASSERT(sizeof(vr_client_line) == VR_CLIENT_BYTES, "vr_client_line size");
VR_STATIC_ASSERT(VR_ALIGNOF(vr_client_line) == 128, "vr_client_line align");
VR_STATIC_ASSERT(offsetof(vr_client_line, parked) == 4, "client parked");
VR_STATIC_ASSERT(offsetof(vr_client_line, push_held) == 8, "client push_held");
VR_STATIC_ASSERT(offsetof(vr_client_line, released_seq) == 16, "client released_seq");
VR_STATIC_ASSERT(offsetof(vr_client_line, heartbeat_ns) == 56, "client heartbeat_ns");
VR_STATIC_ASSERT(offsetof(vr_client_line, reserved1) == 64, "client reserved1");

VR_STATIC_ASSERT(sizeof(vr_packet_info) == 128, "vr_packet_info size");
VR_STATIC_ASSERT(offsetof(vr_packet_info, layout_version) == 8, "packet layout_version");
VR_STATIC_ASSERT(offsetof(vr_packet_info, header_bytes) == 12, "packet header_bytes");
VR_STATIC_ASSERT(offsetof(vr_packet_info, region_bytes) == 16, "packet region_bytes");
VR_STATIC_ASSERT(offsetof(vr_packet_info, epoch) == 24, "packet epoch");
VR_STATIC_ASSERT(offsetof(vr_packet_info, data_offset) == 32, "packet data_offset");
VR_STATIC_ASSERT(offsetof(vr_packet_info, data_bytes) == 40, "packet data_bytes");
VR_STATIC_ASSERT(offsetof(vr_packet_info, records_offset) == 48, "packet records_offset");
VR_STATIC_ASSERT(offsetof(vr_packet_info, record_count) == 56, "packet record_count");
VR_STATIC_ASSERT(offsetof(vr_packet_info, record_bytes) == 60, "packet record_bytes");
VR_STATIC_ASSERT(offsetof(vr_packet_info, max_packet) == 64, "packet max_packet");
VR_STATIC_ASSERT(offsetof(vr_packet_info, codec) == 68, "packet codec");
VR_STATIC_ASSERT(offsetof(vr_packet_info, params_capacity) == 72, "packet params_capacity");
VR_STATIC_ASSERT(offsetof(vr_packet_info, reserved0) == 76, "packet reserved0");
VR_STATIC_ASSERT(offsetof(vr_packet_info, reserved) == 80, "packet reserved");
VR_STATIC_ASSERT(sizeof(vr_packet_seq_line) == 128, "vr_packet_seq_line size");
VR_STATIC_ASSERT(sizeof(vr_packet_tail_line) == 128, "vr_packet_tail_line size");
VR_STATIC_ASSERT(offsetof(vr_packet_tail_line, head) == 8, "packet head");
VR_STATIC_ASSERT(offsetof(vr_packet_tail_line, keyframe_seq) == 16, "packet keyframe_seq");
VR_STATIC_ASSERT(offsetof(vr_packet_params, len) == 8, "params len");
VR_STATIC_ASSERT(offsetof(vr_packet_params, reserved) == 16, "params reserved");
VR_STATIC_ASSERT(offsetof(vr_packet_params, data) == 128, "params data");
VR_STATIC_ASSERT(sizeof(vr_packet_params) == 128 + VR_PACKET_PARAMS_BYTES, "vr_packet_params size");
VR_STATIC_ASSERT(sizeof(vr_packet_header) == 4864, "vr_packet_header size");
VR_STATIC_ASSERT(VR_ALIGNOF(vr_packet_header) == 128, "vr_packet_header align");
VR_STATIC_ASSERT(offsetof(vr_packet_header, seq) == 128, "packet seq line");
VR_STATIC_ASSERT(offsetof(vr_packet_header, tail) == 256, "packet tail line");
VR_STATIC_ASSERT(offsetof(vr_packet_header, producer) == 384, "packet producer line");
VR_STATIC_ASSERT(offsetof(vr_packet_header, doorbell) == 512, "packet doorbell line");
VR_STATIC_ASSERT(offsetof(vr_packet_header, params) == 640, "packet params");
VR_STATIC_ASSERT(sizeof(vr_packet_record) == 64, "vr_packet_record size");
VR_STATIC_ASSERT(VR_ALIGNOF(vr_packet_record) == 64, "vr_packet_record align");
VR_STATIC_ASSERT(offsetof(vr_packet_record, offset) == 8, "record offset");
VR_STATIC_ASSERT(offsetof(vr_packet_record, len) == 16, "record len");
VR_STATIC_ASSERT(offsetof(vr_packet_record, flags) == 20, "record flags");
VR_STATIC_ASSERT(offsetof(vr_packet_record, pts) == 24, "record pts");
VR_STATIC_ASSERT(offsetof(vr_packet_record, dts) == 32, "record dts");
VR_STATIC_ASSERT(offsetof(vr_packet_record, codec) == 40, "record codec");
VR_STATIC_ASSERT(offsetof(vr_packet_record, reserved0) == 44, "record reserved0");
VR_STATIC_ASSERT(offsetof(vr_packet_record, commit_ns) == 48, "record commit_ns");
VR_STATIC_ASSERT(offsetof(vr_packet_record, reserved) == 56, "record reserved");
VR_STATIC_ASSERT(VR_PACKET_DATA_OFFSET(2) == 8192, "packet data offset, 2 records");

VR_STATIC_ASSERT(sizeof(vr_msg_header) == VR_HEADER_BYTES, "vr_msg_header size");
VR_STATIC_ASSERT(sizeof(vr_hello) == VR_HEADER_BYTES + VR_HELLO_BODY_BYTES, "vr_hello size");
VR_STATIC_ASSERT(offsetof(vr_hello, name) == 24, "hello name");
VR_STATIC_ASSERT(offsetof(vr_hello, device_uuid) == 56, "hello device_uuid");
VR_STATIC_ASSERT(sizeof(vr_welcome) == VR_HEADER_BYTES + VR_WELCOME_BODY_BYTES, "vr_welcome size");
VR_STATIC_ASSERT(offsetof(vr_welcome, epoch) == 24, "welcome epoch");
VR_STATIC_ASSERT(offsetof(vr_welcome, control_bytes) == 40, "welcome control_bytes");
VR_STATIC_ASSERT(offsetof(vr_welcome, device_uuid) == 64, "welcome device_uuid");
VR_STATIC_ASSERT(offsetof(vr_welcome, client_bytes) == 80, "welcome client_bytes");
VR_STATIC_ASSERT(sizeof(vr_notice) == VR_HEADER_BYTES + VR_NOTICE_BODY_BYTES, "vr_notice size");
VR_STATIC_ASSERT(offsetof(vr_notice, reason) == 24, "notice reason");
VR_STATIC_ASSERT(sizeof(vr_attach) == VR_HEADER_BYTES + VR_ATTACH_BODY_BYTES, "vr_attach size");
VR_STATIC_ASSERT(sizeof(vr_attach) == 40, "vr_attach is 40 bytes");
VR_STATIC_ASSERT(offsetof(vr_attach, count) == 16, "attach count");
VR_STATIC_ASSERT(offsetof(vr_attach, reserved) == 20, "attach reserved");
VR_STATIC_ASSERT(offsetof(vr_attach, stride) == 24, "attach stride");
VR_STATIC_ASSERT(offsetof(vr_attach, bytes) == 32, "attach bytes");
VR_STATIC_ASSERT(sizeof(vr_notice) <= VR_MAX_MSG_BYTES, "messages fit a datagram");
VR_STATIC_ASSERT(sizeof(vr_attach) <= VR_MAX_MSG_BYTES, "attach fits a datagram");

#endif /* VRAMRING_H */
