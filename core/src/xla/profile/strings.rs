//! Texts a record names by a small number: op names (static) and call sites (a program's
//! attribute, which XLA hands each call in memory of its own). A call looks its text up
//! by content, without a lock or an allocation; a text seen for the first time is copied
//! once, under a lock, and kept for the rest of the process (a program has a bounded
//! number of call sites).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

/// A place of the lookup table: a text's hash (0: free), the copy kept and its number.
/// Written once, `hash` last.
struct Slot {
    hash: AtomicU64,
    text: AtomicUsize,
    len: AtomicUsize,
    id: AtomicUsize,
}

pub struct Strings {
    /// Twice `capacity` places, a power of two: probing always finds a free one.
    slots: Box<[Slot]>,
    /// The texts by number; 0 is the empty text (and what a full table answers).
    texts: Mutex<Vec<&'static str>>,
    capacity: usize,
    /// Lookups answered 0 because the table was full.
    pub refused: AtomicU64,
    /// Static texts' numbers by address: `address << 16 | number` (0: none).
    by_address: [AtomicU64; BY_ADDRESS],
}

const BY_ADDRESS: usize = 128;

/// A text's hash, by words (FxHash's mixing); never 0. Texts are looked up by content:
/// XLA hands a call's attributes in memory of its own, at another address each call.
fn hash(text: &[u8]) -> u64 {
    const K: u64 = 0x517C_C1B7_2722_0A95;
    let mut h = text.len() as u64;
    let mut words = text.chunks_exact(8);
    for word in &mut words {
        let word = u64::from_le_bytes(word.try_into().expect("8 bytes"));
        h = (h.rotate_left(5) ^ word).wrapping_mul(K);
    }
    let mut last = [0u8; 8];
    last[..words.remainder().len()].copy_from_slice(words.remainder());
    h = (h.rotate_left(5) ^ u64::from_le_bytes(last)).wrapping_mul(K);
    h | 1
}

impl Strings {
    pub fn new(capacity: usize) -> Strings {
        let places = (capacity * 2).next_power_of_two();
        Strings {
            slots: (0..places)
                .map(|_| Slot {
                    hash: AtomicU64::new(0),
                    text: AtomicUsize::new(0),
                    len: AtomicUsize::new(0),
                    id: AtomicUsize::new(0),
                })
                .collect(),
            texts: Mutex::new(vec![""]),
            capacity,
            refused: AtomicU64::new(0),
            by_address: [const { AtomicU64::new(0) }; BY_ADDRESS],
        }
    }

    /// The number of `text`, which lives forever: kept as it is. Remembered by its address
    /// too (an op's name is the same text at the same address every call).
    pub fn of_static(&self, text: &'static str) -> usize {
        let address = text.as_ptr() as u64;
        let place = &self.by_address[((address ^ (address >> 9)) as usize) % BY_ADDRESS];
        let known = place.load(Ordering::Relaxed);
        // An address below 2^48 (every user-space one) and a number below 2^16.
        if known >> 16 == address && known != 0 {
            return (known & 0xFFFF) as usize;
        }
        let id = self.number(text, || text);
        if address < 1 << 48 && id < 1 << 16 && !text.is_empty() {
            place.store(address << 16 | id as u64, Ordering::Relaxed);
        }
        id
    }

    /// The number of `text`, which the caller holds only for now: copied the first time.
    pub fn of(&self, text: &str) -> usize {
        self.number(text, || Box::leak(text.to_owned().into_boxed_str()))
    }

    fn number(&self, text: &str, keep: impl FnOnce() -> &'static str) -> usize {
        if text.is_empty() {
            return 0;
        }
        let hash = hash(text.as_bytes());
        self.find(text, hash)
            .unwrap_or_else(|| self.add(text, hash, keep))
    }

    /// The place `text` is at, or the free one its probe ends at.
    fn probe(&self, text: &str, hash: u64) -> Result<usize, usize> {
        let mask = self.slots.len() - 1;
        let mut at = (hash >> 7) as usize & mask;
        loop {
            let slot = &self.slots[at];
            let found = slot.hash.load(Ordering::Acquire);
            if found == 0 {
                return Err(at);
            }
            if found == hash && slot.len.load(Ordering::Relaxed) == text.len() {
                let kept = slot.text.load(Ordering::Relaxed);
                // SAFETY: `kept` is a text this table copied or was given as 'static, of
                // `len` bytes, never freed.
                let kept = unsafe { std::slice::from_raw_parts(kept as *const u8, text.len()) };
                if kept == text.as_bytes() {
                    return Ok(slot.id.load(Ordering::Relaxed));
                }
            }
            at = (at + 1) & mask;
        }
    }

    fn find(&self, text: &str, hash: u64) -> Option<usize> {
        self.probe(text, hash).ok()
    }

    /// Numbers `text`, kept as `keep` makes it (called only for a text never seen).
    #[cold]
    fn add(&self, text: &str, hash: u64, keep: impl FnOnce() -> &'static str) -> usize {
        let mut texts = self.texts.lock().unwrap_or_else(|p| p.into_inner());
        let at = match self.probe(text, hash) {
            Ok(id) => return id,
            Err(at) => at,
        };
        if texts.len() > self.capacity {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return 0;
        }
        let stored = keep();
        texts.push(stored);
        let id = texts.len() - 1;
        let slot = &self.slots[at];
        slot.text.store(stored.as_ptr() as usize, Ordering::Relaxed);
        slot.len.store(stored.len(), Ordering::Relaxed);
        slot.id.store(id, Ordering::Relaxed);
        // Last, released: a reader that sees the hash sees the rest.
        slot.hash.store(hash, Ordering::Release);
        id
    }

    /// Every text, by number.
    pub fn all(&self) -> Vec<&'static str> {
        self.texts.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_text_keeps_its_number_wherever_it_lives() {
        let strings = Strings::new(4);
        let a = strings.of_static("allreduce");
        assert_eq!(a, 1);
        assert_eq!(strings.of_static("allreduce"), a);
        let site = String::from("jit(step)/halo");
        let s = strings.of(&site);
        assert_eq!(s, 2);
        assert_eq!(strings.of(&site), s);
        // The same content elsewhere: the same number.
        assert_eq!(strings.of(&site.clone()), s);
        assert_eq!(strings.of("allreduce"), a);
        // Another content, of the same length.
        assert_eq!(strings.of("Jit(step)/halo"), 3);
        assert_eq!(strings.of(""), 0);
        assert_eq!(
            strings.all(),
            vec!["", "allreduce", "jit(step)/halo", "Jit(step)/halo"]
        );
    }

    #[test]
    fn a_full_table_answers_the_empty_text_and_counts() {
        let strings = Strings::new(2);
        let texts: Vec<String> = (0..5).map(|i| format!("site {i}")).collect();
        let ids: Vec<usize> = texts.iter().map(|t| strings.of(t)).collect();
        assert_eq!(ids, vec![1, 2, 0, 0, 0]);
        assert_eq!(strings.refused.load(Ordering::Relaxed), 3);
    }
}
