//! The profile's clock, and how each rank's is set against rank 0's.
//!
//! Every record is stamped with CLOCK_MONOTONIC in nanoseconds: what `Instant` reads, so
//! a started op's `Instant` converts, and on one host the same clock in every process.
//! Ranks on different hosts count from different origins and at slightly different rates:
//! `sync` measures this rank's offset from rank 0's clock by round trips, at the
//! profile's start and at its end, and the trace places each record by the offset
//! interpolated between the two (`Alignment`).

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::{Broadcast, Buf, BufMut, Comm, Dtype, Library, Peer, Result};

#[repr(C)]
struct Timespec {
    tv_sec: i64,
    tv_nsec: i64,
}

extern "C" {
    /// POSIX; every libc has it (LP64 Linux: two 64-bit fields).
    fn clock_gettime(clock: i32, time: *mut Timespec) -> i32;
}

const CLOCK_MONOTONIC: i32 = 1;

/// For the tests of the alignment: a shift (ns) and a rate error (ns per second) added to
/// this process's clock, as a rank on another host would have (`set_skew`).
static SKEW_NS: AtomicI64 = AtomicI64::new(0);
static SKEW_PPB: AtomicI64 = AtomicI64::new(0);
/// The raw clock when the skew was set: it gains from then on.
static SKEW_SINCE: AtomicI64 = AtomicI64::new(0);

/// This process's monotonic clock, in nanoseconds.
#[inline]
pub fn now_ns() -> u64 {
    let mut time = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `time` is a valid, writable timespec; CLOCK_MONOTONIC always exists.
    unsafe { clock_gettime(CLOCK_MONOTONIC, &mut time) };
    let raw = (time.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(time.tv_nsec as u64);
    skewed(raw)
}

#[inline]
fn skewed(raw: u64) -> u64 {
    let shift = SKEW_NS.load(Ordering::Relaxed);
    let rate = SKEW_PPB.load(Ordering::Relaxed);
    if shift == 0 && rate == 0 {
        return raw;
    }
    let since = SKEW_SINCE.load(Ordering::Relaxed);
    let drift = ((raw as i128 - since as i128) * rate as i128 / 1_000_000_000) as i64;
    raw.wrapping_add_signed(shift.wrapping_add(drift))
}

/// Shifts this process's profile clock by `shift_ns` and makes it run `rate_ppb`
/// nanoseconds per second fast: the tests' stand-in for a rank on another host.
pub fn set_skew(shift_ns: i64, rate_ppb: i64) {
    SKEW_NS.store(0, Ordering::Relaxed);
    SKEW_PPB.store(0, Ordering::Relaxed);
    SKEW_SINCE.store(now_ns() as i64, Ordering::Relaxed);
    SKEW_NS.store(shift_ns, Ordering::Relaxed);
    SKEW_PPB.store(rate_ppb, Ordering::Relaxed);
}

/// An `Instant` of this process on the profile's clock.
pub fn ns_of(instant: Instant) -> u64 {
    now_ns().saturating_sub(instant.elapsed().as_nanos() as u64)
}

/// One measurement of this rank's clock against rank 0's.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sync {
    /// When it was taken, on this rank's clock.
    pub local_ns: u64,
    /// Rank 0's clock minus this rank's (0 on rank 0).
    pub offset_ns: i64,
    /// The round trip it was measured over: the offset is good to half of it.
    pub round_trip_ns: u64,
    /// Rank 0's clock when rank 0 ended the measurement, the same on every rank: the
    /// profile's origin (its time 0), when this is the start's.
    pub reference_ns: u64,
    /// Rank 0's wall clock then (Unix time, ns): names the run.
    pub reference_unix_ns: u64,
}

/// Round trips per rank; the shortest gives the offset (a rank descheduled in the middle
/// of one only lengthens that one).
pub const ROUNDS: usize = 12;

/// Measures this rank's clock against rank 0's: rank 0 answers each rank's `rounds`
/// pings with its clock, one rank after the other; then rank 0 broadcasts its clock and
/// wall clock. Collective over `comm` (on a communicator of its own: no other message
/// can match these).
pub fn sync(library: &dyn Library, comm: Comm, rounds: usize) -> Result<Sync> {
    let backend = library.backend();
    let rank = library.comm_rank(comm)?;
    let size = library.comm_size(comm)?;
    let mut word = [0u8; 8];
    let mut best = Sync::default();
    if rank == 0 {
        for peer in 1..size {
            for _ in 0..rounds {
                backend.recv(
                    comm,
                    BufMut::from_bytes(&mut word, Dtype::U8)?,
                    Peer::Rank(peer),
                    Some(0),
                )?;
                let now = now_ns().to_ne_bytes();
                backend.send(comm, Buf::from_bytes(&now, Dtype::U8)?, Peer::Rank(peer), 0)?;
            }
        }
        best.local_ns = now_ns();
    } else {
        best.round_trip_ns = u64::MAX;
        for _ in 0..rounds {
            let sent = now_ns();
            let ping = sent.to_ne_bytes();
            backend.send(comm, Buf::from_bytes(&ping, Dtype::U8)?, Peer::Rank(0), 0)?;
            backend.recv(
                comm,
                BufMut::from_bytes(&mut word, Dtype::U8)?,
                Peer::Rank(0),
                Some(0),
            )?;
            let back = now_ns();
            let theirs = u64::from_ne_bytes(word);
            let round_trip = back.saturating_sub(sent);
            if round_trip < best.round_trip_ns {
                let middle = sent + round_trip / 2;
                best = Sync {
                    local_ns: middle,
                    offset_ns: (theirs as i128 - middle as i128) as i64,
                    round_trip_ns: round_trip,
                    ..best
                };
            }
        }
    }
    let mut reference = [0u8; 16];
    if rank == 0 {
        let unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        reference[..8].copy_from_slice(&now_ns().to_ne_bytes());
        reference[8..].copy_from_slice(&unix.to_ne_bytes());
    }
    let buf = match rank {
        0 => Broadcast::Root(Buf::from_bytes(&reference, Dtype::U8)?),
        _ => Broadcast::Receiver(BufMut::from_bytes(&mut reference, Dtype::U8)?),
    };
    backend.bcast(comm, buf, 0)?;
    let word = |at: usize| u64::from_ne_bytes(reference[at..at + 8].try_into().expect("8 bytes"));
    best.reference_ns = word(0);
    best.reference_unix_ns = word(8);
    Ok(best)
}

/// Where a record of this rank lies on rank 0's clock, from the start's and the end's
/// measurements: the offset interpolated between them (the clocks' rates differ by some
/// parts per million), relative to the profile's origin.
#[derive(Clone, Copy, Debug)]
pub struct Alignment {
    /// Rank 0's clock at time 0 of the trace.
    pub origin_ns: u64,
    pub start: Sync,
    pub end: Option<Sync>,
}

impl Alignment {
    /// This rank's clock reading `local` as nanoseconds since the origin, on rank 0's
    /// clock (negative before it).
    pub fn aligned_ns(&self, local: u64) -> i64 {
        let offset = match self.end {
            Some(end) if end.local_ns > self.start.local_ns => {
                let span = (end.local_ns - self.start.local_ns) as f64;
                let along = (local as f64 - self.start.local_ns as f64) / span;
                self.start.offset_ns as f64 + along * (end.offset_ns - self.start.offset_ns) as f64
            }
            _ => self.start.offset_ns as f64,
        };
        (local as i128 + offset.round() as i128 - self.origin_ns as i128) as i64
    }

    /// How fast this rank's clock runs against rank 0's, in parts per million (0 without
    /// an end measurement).
    pub fn drift_ppm(&self) -> f64 {
        match self.end {
            Some(end) if end.local_ns > self.start.local_ns => {
                let span = (end.local_ns - self.start.local_ns) as f64;
                -((end.offset_ns - self.start.offset_ns) as f64) / span * 1e6
            }
            _ => 0.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_counts_as_instant_does() {
        let before = Instant::now();
        let stamped = now_ns();
        assert!(ns_of(before) <= stamped);
        assert!(stamped - ns_of(before) < 1_000_000_000);
    }

    #[test]
    fn records_are_placed_by_the_offset_between_the_two_measurements() {
        let start = Sync {
            local_ns: 1_000,
            offset_ns: 500,
            ..Sync::default()
        };
        let end = Sync {
            local_ns: 1_000_001_000,
            offset_ns: 500 - 1_000,
            ..Sync::default()
        };
        let only_start = Alignment {
            origin_ns: 1_500,
            start,
            end: None,
        };
        assert_eq!(only_start.aligned_ns(1_000), 0);
        assert_eq!(only_start.aligned_ns(3_000), 2_000);
        assert_eq!(only_start.drift_ppm(), 0.0);
        let both = Alignment {
            end: Some(end),
            ..only_start
        };
        assert_eq!(both.aligned_ns(1_000), 0);
        // Half way: half of the 1 us the offset lost.
        assert_eq!(both.aligned_ns(500_001_000), 500_000_000 - 500);
        assert_eq!(both.aligned_ns(1_000_001_000), 1_000_000_000 - 1_000);
        // This rank's clock gained 1 us in 1 s on rank 0's.
        assert!((both.drift_ppm() - 1.0).abs() < 1e-9);
    }
}
