//! The records of a profile: memory set aside when it starts, a record per call written
//! into it without a lock or an allocation, and totals per op, call site and route that
//! stay exact when the records overflow.
//!
//! Off, a call pays one load (`begin` reads the current profile's pointer, null). On, a
//! call reserves the next record with one atomic add, writes its eight words, and adds to
//! its op's totals (its thread's own: plain stores); once the records are full, further calls are counted as dropped (their
//! totals still add up). Starting again reuses the memory: each record carries its
//! profile's generation, so a record of an earlier profile is never read as one of this.

use std::alloc::{alloc_zeroed, Layout};
use std::cell::Cell;
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use super::clock::now_ns;
use super::strings::Strings;

/// Which way a call reached MPI.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Route {
    /// A jaxmpi op on an MPI communicator.
    Jaxmpi = 0,
    /// A jaxmpi op on a MeshComm (ranks are devices).
    MeshComm = 1,
    /// JAX's collectives, as jaxmpi's HLO pass rewrote them.
    Pass = 2,
    /// JAX's collectives through XLA's MPI backend (the plug-in, JAX < 0.10.2).
    Plugin = 3,
}

impl Route {
    pub const ALL: [Route; 4] = [Route::Jaxmpi, Route::MeshComm, Route::Pass, Route::Plugin];

    pub fn name(self) -> &'static str {
        match self {
            Route::Jaxmpi => "jaxmpi",
            Route::MeshComm => "MeshComm",
            Route::Pass => "pass",
            Route::Plugin => "plug-in",
        }
    }
}

/// What a record is of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Kind {
    /// A whole call (blocking op, or an MPI call of XLA's).
    Call = 0,
    /// The call of a started op (`iallreduce`): its transfer started.
    Start = 1,
    /// The call of a request's `wait`.
    Wait = 2,
    /// A started op's request, from its start to its completion (not a call).
    Completed = 3,
}

impl Kind {
    pub const ALL: [Kind; 4] = [Kind::Call, Kind::Start, Kind::Wait, Kind::Completed];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Call => "call",
            Kind::Start => "start",
            Kind::Wait => "wait",
            Kind::Completed => "in flight",
        }
    }
}

/// What a caller says of its call.
pub struct Fields<'a> {
    pub name: &'static str,
    /// Where the program named the call (a `jax.named_scope`, the JAX op of an XLA
    /// collective); empty if nowhere.
    pub site: &'a str,
    pub route: Route,
    pub kind: Kind,
    pub bytes: u64,
    /// The communicator's handle, or the MeshComm's number.
    pub group: u64,
    /// The communicator's number in this process's programs (`frame/handles.rs`), or a
    /// MeshComm's (negative); 0 where the call has none.
    pub comm_id: i32,
    /// The device the call ran for (-1: none, or not known).
    pub device: i32,
    /// A started op's request key (its start, its wait, its completion), else 0.
    pub request: u64,
    /// A request's time between its wait's beginning and its completion (Completed).
    pub waited: u64,
    pub failed: bool,
}

/// One record, read back.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Record {
    pub start: u64,
    pub end: u64,
    pub waited: u64,
    pub bytes: u64,
    pub group: u64,
    pub request: u64,
    pub comm_id: i32,
    pub device: i32,
    pub name: usize,
    pub site: usize,
    pub route: Route,
    pub kind: Kind,
    pub failed: bool,
    /// Which thread made it (`threads()`), from 1.
    pub thread: usize,
}

const NAME_BITS: u32 = 10;
const SITE_BITS: u32 = 16;
const THREAD_BITS: u32 = 12;
const GENERATION_BITS: u32 = 19;
const SITE_AT: u32 = NAME_BITS;
const ROUTE_AT: u32 = SITE_AT + SITE_BITS;
const KIND_AT: u32 = ROUTE_AT + 3;
const FAILED_AT: u32 = KIND_AT + 3;
const THREAD_AT: u32 = FAILED_AT + 1;
const GENERATION_AT: u32 = THREAD_AT + THREAD_BITS;
const _: () = assert!(GENERATION_AT + GENERATION_BITS == 64);

fn mask(bits: u32) -> u64 {
    (1 << bits) - 1
}

/// The numbers of op names and call sites (each fits its record's field; a text past
/// them is recorded as the empty one).
fn names() -> &'static Strings {
    static NAMES: OnceLock<Strings> = OnceLock::new();
    NAMES.get_or_init(|| Strings::new(mask(NAME_BITS) as usize - 1))
}

fn sites() -> &'static Strings {
    static SITES: OnceLock<Strings> = OnceLock::new();
    SITES.get_or_init(|| Strings::new(mask(SITE_BITS) as usize - 1))
}

/// A record's eight words: start, end, waited, bytes, group, request, (comm id, device),
/// and the packed rest (its generation last: 0 is no record).
type Slot = [AtomicU64; 8];

/// An op's totals in one profile: by op name, call site, route and kind.
struct Tally {
    key: AtomicU64,
    calls: AtomicU64,
    bytes: AtomicU64,
    ns: AtomicU64,
    waited: AtomicU64,
    failed: AtomicU64,
}

const TALLIES: usize = 4096;

pub struct Profile {
    slots: Box<[Slot]>,
    /// Records this profile may fill (`slots` may hold more: an earlier profile's).
    capacity: AtomicUsize,
    next: AtomicUsize,
    dropped: AtomicU64,
    generation: AtomicU64,
    tallies: Box<[Tally]>,
    /// Calls whose totals found no place (more than `TALLIES` op, site, route and thread).
    untallied: AtomicU64,
}

/// The profile recording now; null when none.
static CURRENT: AtomicPtr<Profile> = AtomicPtr::new(std::ptr::null_mut());
/// The profile's memory, kept for the next one (never freed: a call that began before a
/// stop may still write to it).
static KEPT: Mutex<Option<&'static Profile>> = Mutex::new(None);

/// A call being recorded: what `begin` gives while a profile records.
#[derive(Clone, Copy)]
pub struct Begun {
    profile: &'static Profile,
    pub start: u64,
}

/// The beginning of a call: None (one load) unless a profile records.
#[inline(always)]
pub fn begin() -> Option<Begun> {
    let profile = CURRENT.load(Ordering::Acquire);
    if profile.is_null() {
        return None;
    }
    Some(begun(profile))
}

/// Out of line: what a call pays only while a profile records stays out of the handlers'
/// code, whose size decides what the compiler inlines into them.
#[cold]
#[inline(never)]
fn begun(profile: *const Profile) -> Begun {
    // SAFETY: a non-null CURRENT is a leaked (never freed) Profile.
    let profile = unsafe { &*profile };
    Begun {
        profile,
        start: now_ns(),
    }
}

impl Begun {
    /// Records the call, ending now.
    pub fn record(self, fields: &Fields) {
        let end = now_ns();
        self.profile.add(self.start, end, fields);
    }

    /// Records a span that began at `start` (not this call's beginning), ending now.
    pub fn record_from(self, start: u64, fields: &Fields) {
        let end = now_ns();
        self.profile.add(start, end, fields);
    }
}

thread_local! {
    /// This thread's number in the profile (0: not numbered yet).
    static THREAD: Cell<u16> = const { Cell::new(0) };
}

static THREADS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// This thread's number, from 1, naming it the first time (once per thread).
fn thread() -> u64 {
    let known = THREAD.with(|t| t.get());
    if known != 0 {
        return u64::from(known);
    }
    let mut threads = THREADS.lock().unwrap_or_else(|p| p.into_inner());
    if threads.len() as u64 >= mask(THREAD_BITS) {
        return 0;
    }
    let current = std::thread::current();
    threads.push(current.name().unwrap_or("unnamed").to_string());
    let number = threads.len() as u16;
    THREAD.with(|t| t.set(number));
    u64::from(number)
}

/// The names of the threads that recorded, by number (from 1).
pub fn threads() -> Vec<String> {
    THREADS.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// The op names and call sites records refer to, by number.
pub fn texts() -> (Vec<&'static str>, Vec<&'static str>) {
    (names().all(), sites().all())
}

/// A total's key: op name, call site, route, kind and the thread that adds to it, so that
/// only one thread ever writes a total (plain stores, no atomic read-modify-write); the
/// totals of one op over threads are added up when read.
fn tally_key(name: u64, site: u64, route: Route, kind: Kind, thread: u64) -> u64 {
    1 << 63
        | name
        | site << SITE_AT
        | u64::from(route as u8) << ROUTE_AT
        | u64::from(kind as u8) << KIND_AT
        | thread << THREAD_AT
}

/// Adds `value` to a counter only the calling thread writes (see `tally_key`).
fn bump(counter: &AtomicU64, value: u64) {
    counter.store(
        counter.load(Ordering::Relaxed).wrapping_add(value),
        Ordering::Relaxed,
    );
}

impl Profile {
    fn add(&self, start: u64, end: u64, f: &Fields) {
        let name = names().of_static(f.name) as u64 & mask(NAME_BITS);
        let site = sites().of(f.site) as u64 & mask(SITE_BITS);
        let thread = thread() & mask(THREAD_BITS);
        let took = end.saturating_sub(start);
        self.tally(tally_key(name, site, f.route, f.kind, thread), f, took);
        let index = self.next.fetch_add(1, Ordering::Relaxed);
        if index >= self.capacity.load(Ordering::Relaxed) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let generation = self.generation.load(Ordering::Relaxed);
        let packed = name
            | site << SITE_AT
            | u64::from(f.route as u8) << ROUTE_AT
            | u64::from(f.kind as u8) << KIND_AT
            | u64::from(f.failed) << FAILED_AT
            | thread << THREAD_AT
            | generation << GENERATION_AT;
        let slot = &self.slots[index];
        let words = [
            start,
            end,
            f.waited,
            f.bytes,
            f.group,
            f.request,
            u64::from(f.comm_id as u32) | u64::from(f.device as u32) << 32,
        ];
        for (word, value) in slot.iter().zip(words) {
            word.store(value, Ordering::Relaxed);
        }
        // Last, released: a reader that sees the generation sees the words before it.
        slot[7].store(packed, Ordering::Release);
    }

    fn tally(&self, key: u64, f: &Fields, took: u64) {
        let places = self.tallies.len();
        let mut at = (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) as usize % places;
        for _ in 0..places {
            let tally = &self.tallies[at];
            let found = tally.key.load(Ordering::Relaxed);
            let ours = found == key
                || (found == 0
                    && match tally.key.compare_exchange(
                        0,
                        key,
                        Ordering::Relaxed,
                        Ordering::Relaxed,
                    ) {
                        Ok(_) => true,
                        Err(now) => now == key,
                    });
            if ours {
                bump(&tally.calls, 1);
                bump(&tally.bytes, f.bytes);
                bump(&tally.ns, took);
                if f.waited != 0 {
                    bump(&tally.waited, f.waited);
                }
                if f.failed {
                    bump(&tally.failed, 1);
                }
                return;
            }
            at = (at + 1) % places;
        }
        self.untallied.fetch_add(1, Ordering::Relaxed);
    }

    fn allocate(capacity: usize) -> &'static Profile {
        let slots = if capacity == 0 {
            Box::new([])
        } else {
            let layout = Layout::array::<Slot>(capacity).expect("a profile's records fit memory");
            // SAFETY: the layout is not empty. All-zero bytes are valid AtomicU64s (and a
            // zero generation is no record); large zeroed allocations come from the
            // system as untouched pages, so a profile costs memory only as it fills.
            let ptr = unsafe { alloc_zeroed(layout) } as *mut Slot;
            if ptr.is_null() {
                std::alloc::handle_alloc_error(layout);
            }
            // SAFETY: `ptr` holds `capacity` zeroed slots allocated with the global
            // allocator and this layout, which the Box takes over.
            unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr, capacity)) }
        };
        let tallies = (0..TALLIES)
            .map(|_| Tally {
                key: AtomicU64::new(0),
                calls: AtomicU64::new(0),
                bytes: AtomicU64::new(0),
                ns: AtomicU64::new(0),
                waited: AtomicU64::new(0),
                failed: AtomicU64::new(0),
            })
            .collect();
        Box::leak(Box::new(Profile {
            slots,
            capacity: AtomicUsize::new(capacity),
            next: AtomicUsize::new(0),
            dropped: AtomicU64::new(0),
            generation: AtomicU64::new(0),
            tallies,
            untallied: AtomicU64::new(0),
        }))
    }
}

/// What a profile recorded, once stopped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub recorded: u64,
    /// Calls past the records' capacity: in the totals, not in the records.
    pub dropped: u64,
    pub capacity: u64,
    /// Calls in no total: more distinct ops, sites and routes than the totals hold.
    pub untallied: u64,
    /// Call sites recorded as none: more distinct ones than a profile numbers.
    pub sites_refused: u64,
}

/// Starts recording into `capacity` records (memory reused from an earlier profile where
/// it is large enough). Refused while a profile records.
pub fn start(capacity: usize) -> Result<(), &'static str> {
    let mut kept = KEPT.lock().unwrap_or_else(|p| p.into_inner());
    if !CURRENT.load(Ordering::Acquire).is_null() {
        return Err("a profile is recording already");
    }
    // The texts' tables, before the first call needs them.
    let _ = (names(), sites());
    let profile = match *kept {
        Some(profile) if profile.slots.len() >= capacity => profile,
        _ => Profile::allocate(capacity),
    };
    *kept = Some(profile);
    let generation = (profile.generation.load(Ordering::Relaxed) + 1) & mask(GENERATION_BITS);
    profile
        .generation
        .store(generation.max(1), Ordering::Relaxed);
    profile.capacity.store(capacity, Ordering::Relaxed);
    profile.next.store(0, Ordering::Relaxed);
    profile.dropped.store(0, Ordering::Relaxed);
    profile.untallied.store(0, Ordering::Relaxed);
    for tally in profile.tallies.iter() {
        for counter in [
            &tally.key,
            &tally.calls,
            &tally.bytes,
            &tally.ns,
            &tally.waited,
            &tally.failed,
        ] {
            counter.store(0, Ordering::Relaxed);
        }
    }
    CURRENT.store(profile as *const Profile as *mut Profile, Ordering::Release);
    Ok(())
}

/// Whether a profile records now.
pub fn recording() -> bool {
    !CURRENT.load(Ordering::Acquire).is_null()
}

/// Stops recording (calls already begun may still add theirs). None if none recorded.
pub fn stop() -> Option<Stats> {
    let _kept = KEPT.lock().unwrap_or_else(|p| p.into_inner());
    let profile = CURRENT.swap(std::ptr::null_mut(), Ordering::AcqRel);
    if profile.is_null() {
        return None;
    }
    // SAFETY: a non-null CURRENT is a leaked (never freed) Profile.
    let profile = unsafe { &*profile };
    Some(stats_of(profile))
}

fn stats_of(profile: &Profile) -> Stats {
    let capacity = profile.capacity.load(Ordering::Relaxed);
    let next = profile.next.load(Ordering::Relaxed);
    Stats {
        recorded: next.min(capacity) as u64,
        dropped: profile.dropped.load(Ordering::Relaxed),
        capacity: capacity as u64,
        untallied: profile.untallied.load(Ordering::Relaxed),
        sites_refused: sites().refused.load(Ordering::Relaxed),
    }
}

/// The last profile's (or the current one's) records, in the order calls ended.
pub fn records() -> Vec<Record> {
    let Some(profile) = *KEPT.lock().unwrap_or_else(|p| p.into_inner()) else {
        return Vec::new();
    };
    let generation = profile.generation.load(Ordering::Relaxed);
    let filled = stats_of(profile).recorded as usize;
    let mut records = Vec::with_capacity(filled);
    for slot in &profile.slots[..filled] {
        let packed = slot[7].load(Ordering::Acquire);
        if packed >> GENERATION_AT != generation {
            continue; // still being written, or an earlier profile's
        }
        let word = |i: usize| slot[i].load(Ordering::Relaxed);
        let field = |at: u32, bits: u32| (packed >> at) & mask(bits);
        let route = Route::ALL[field(ROUTE_AT, 3) as usize % Route::ALL.len()];
        let kind = Kind::ALL[field(KIND_AT, 3) as usize % Kind::ALL.len()];
        records.push(Record {
            start: word(0),
            end: word(1),
            waited: word(2),
            bytes: word(3),
            group: word(4),
            request: word(5),
            comm_id: word(6) as u32 as i32,
            device: (word(6) >> 32) as u32 as i32,
            name: field(0, NAME_BITS) as usize,
            site: field(SITE_AT, SITE_BITS) as usize,
            route,
            kind,
            failed: field(FAILED_AT, 1) == 1,
            thread: field(THREAD_AT, THREAD_BITS) as usize,
        });
    }
    records
}

/// One total of the last profile: every call of one op, at one call site, by one route,
/// of one kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Total {
    pub name: &'static str,
    pub site: &'static str,
    pub route: Route,
    pub kind: Kind,
    pub calls: u64,
    pub bytes: u64,
    pub ns: u64,
    pub waited: u64,
    pub failed: u64,
}

/// The last profile's totals (exact even where records were dropped).
pub fn totals() -> Vec<Total> {
    let Some(profile) = *KEPT.lock().unwrap_or_else(|p| p.into_inner()) else {
        return Vec::new();
    };
    let (names, sites) = texts();
    let text = |texts: &[&'static str], i: u64| texts.get(i as usize).copied().unwrap_or("");
    let mut totals: Vec<Total> = Vec::new();
    for tally in profile.tallies.iter() {
        let key = tally.key.load(Ordering::Relaxed);
        let calls = tally.calls.load(Ordering::Relaxed);
        if key == 0 || calls == 0 {
            continue;
        }
        let total = Total {
            name: text(&names, key & mask(NAME_BITS)),
            site: text(&sites, (key >> SITE_AT) & mask(SITE_BITS)),
            route: Route::ALL[((key >> ROUTE_AT) & 7) as usize % Route::ALL.len()],
            kind: Kind::ALL[((key >> KIND_AT) & 7) as usize % Kind::ALL.len()],
            calls,
            bytes: tally.bytes.load(Ordering::Relaxed),
            ns: tally.ns.load(Ordering::Relaxed),
            waited: tally.waited.load(Ordering::Relaxed),
            failed: tally.failed.load(Ordering::Relaxed),
        };
        // One total per op, site, route and kind: the threads' added up.
        let same = |t: &&mut Total| {
            (t.name, t.site, t.route, t.kind) == (total.name, total.site, total.route, total.kind)
        };
        match totals.iter_mut().find(same) {
            Some(t) => {
                t.calls += total.calls;
                t.bytes += total.bytes;
                t.ns += total.ns;
                t.waited += total.waited;
                t.failed += total.failed;
            }
            None => totals.push(total),
        }
    }
    totals
        .sort_by(|a, b| (a.route, a.name, a.kind, a.site).cmp(&(b.route, b.name, b.kind, b.site)));
    totals
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The process has one profile: its tests run one after the other.
    static SERIAL: Mutex<()> = Mutex::new(());

    fn call<'a>(name: &'static str, site: &'a str, bytes: u64) -> Fields<'a> {
        Fields {
            name,
            site,
            route: Route::Jaxmpi,
            kind: Kind::Call,
            bytes,
            group: 0x4400_0000,
            comm_id: 1,
            device: -1,
            request: 0,
            waited: 0,
            failed: false,
        }
    }

    #[test]
    fn calls_are_recorded_while_a_profile_records_and_counted_past_its_capacity() {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        assert!(begin().is_none());
        start(3).unwrap();
        assert!(start(3).is_err());
        for i in 0..5 {
            let site = format!("jit(step)/site{}", i % 2);
            begin().unwrap().record(&call("allreduce", &site, 16));
        }
        let stats = stop().unwrap();
        assert!(begin().is_none());
        assert_eq!(stop(), None);
        assert_eq!((stats.recorded, stats.dropped, stats.capacity), (3, 2, 3));
        let records = records();
        assert_eq!(records.len(), 3);
        let (names, sites) = texts();
        assert!(records.iter().all(|r| names[r.name] == "allreduce"
            && r.bytes == 16
            && r.comm_id == 1
            && r.device == -1
            && r.end >= r.start
            && r.thread >= 1));
        assert_eq!(sites[records[1].site], "jit(step)/site1");
        // Totals count every call, the dropped ones too.
        let totals = totals();
        let calls: Vec<(&str, u64, u64)> =
            totals.iter().map(|t| (t.site, t.calls, t.bytes)).collect();
        assert_eq!(
            calls,
            vec![("jit(step)/site0", 3, 48), ("jit(step)/site1", 2, 32)]
        );

        // A second profile reuses the memory; the first one's records are gone.
        start(3).unwrap();
        begin().unwrap().record(&Fields {
            device: 3,
            comm_id: -2,
            route: Route::MeshComm,
            ..call("allgather", "", 8)
        });
        assert_eq!(stop().unwrap().recorded, 1);
        let records = super::records();
        assert_eq!(records.len(), 1);
        assert_eq!(
            (records[0].device, records[0].comm_id, records[0].route),
            (3, -2, Route::MeshComm)
        );
        assert_eq!(super::totals().len(), 1);
    }
}
