//! Handles as compiled programs carry them: small ids instead of the raw values. A
//! communicator's or user op's handle, or an mpi4py Status's address, differs between runs
//! (Open MPI's handles and every address are pointers) and between ranks, so a program
//! holding raw values would miss JAX's persistent compilation cache on every start, and one
//! served from it could write to an address of another run. Python registers each value
//! when it lowers a program (`_native.handle_id`): the n-th value a process registers gets
//! id n, the same in every run of the same program; the handler maps the id back.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

/// What a handle is a handle of: each has its own ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Table {
    Comm,
    /// Addresses and handles that are no communicator (a Status's MPI_Status, a user op).
    Address,
}

const CHUNK: usize = 1024;
const CHUNKS: usize = 64;

/// Values by id, append-only: every call reads one (an atomic load, no lock), Python adds
/// one now and then (under `adding`).
struct Values {
    chunks: [OnceLock<Box<[AtomicUsize; CHUNK]>>; CHUNKS],
    len: AtomicUsize,
    adding: Mutex<()>,
}

impl Values {
    const fn new() -> Values {
        Values {
            chunks: [const { OnceLock::new() }; CHUNKS],
            len: AtomicUsize::new(0),
            adding: Mutex::new(()),
        }
    }

    fn get(&self, index: usize) -> Option<usize> {
        if index >= self.len.load(Ordering::Acquire) {
            return None;
        }
        let chunk = self.chunks[index / CHUNK].get()?;
        Some(chunk[index % CHUNK].load(Ordering::Relaxed))
    }

    fn index_of(&self, raw: usize) -> Option<usize> {
        (0..self.len.load(Ordering::Acquire)).find(|&i| self.get(i) == Some(raw))
    }

    fn add(&self, raw: usize) -> usize {
        let _adding = self.adding.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(index) = self.index_of(raw) {
            return index;
        }
        let index = self.len.load(Ordering::Relaxed);
        assert!(
            index < CHUNK * CHUNKS,
            "more than {} handles lowered",
            CHUNK * CHUNKS
        );
        let chunk = self.chunks[index / CHUNK]
            .get_or_init(|| Box::new(std::array::from_fn(|_| AtomicUsize::new(0))));
        chunk[index % CHUNK].store(raw, Ordering::Relaxed);
        // Published after the value: a reader that sees the length sees the value.
        self.len.store(index + 1, Ordering::Release);
        index
    }
}

static COMMS: Values = Values::new();
static ADDRESSES: Values = Values::new();

fn table(which: Table) -> &'static Values {
    match which {
        Table::Comm => &COMMS,
        Table::Address => &ADDRESSES,
    }
}

/// The id of `raw` (registered now if new); 0 stays 0, the "none" of an address.
pub fn id_of(which: Table, raw: usize) -> i64 {
    if raw == 0 {
        return 0;
    }
    let values = table(which);
    let index = values.index_of(raw).unwrap_or_else(|| values.add(raw));
    index as i64 + 1
}

/// The raw value of `id`, if this process registered it.
pub fn resolve(which: Table, id: i64) -> Option<usize> {
    if id == 0 {
        return Some(0);
    }
    usize::try_from(id - 1)
        .ok()
        .and_then(|i| table(which).get(i))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_follow_the_order_of_registration_and_map_back() {
        let (a, b) = (0x7f00_1234_5678, 0x7f00_8765_4321);
        let (ia, ib) = (id_of(Table::Address, a), id_of(Table::Address, b));
        assert_ne!(ia, ib);
        assert_eq!(id_of(Table::Address, a), ia);
        assert_eq!(resolve(Table::Address, ia), Some(a));
        assert_eq!(resolve(Table::Address, ib), Some(b));
        assert_eq!(id_of(Table::Address, 0), 0);
        assert_eq!(resolve(Table::Address, 0), Some(0));
        assert_eq!(resolve(Table::Comm, 1_000_000), None);
    }
}
