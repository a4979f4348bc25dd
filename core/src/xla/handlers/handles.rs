//! Handles as compiled programs carry them: small ids instead of the raw values. A
//! communicator's or user op's handle, or an mpi4py Status's address, differs between runs
//! (Open MPI's handles and every address are pointers) and between ranks, so a program
//! holding raw values would miss JAX's persistent compilation cache on every start, and one
//! served from it could write to an address of another run. Python registers each value
//! when it lowers a program (`_native.handle_id`): the n-th value a process registers gets
//! id n, the same in every run of the same program; the handler maps the id back.

use std::sync::RwLock;

/// What a handle is a handle of: each has its own ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Table {
    Comm,
    /// Addresses and handles that are no communicator (a Status's MPI_Status, a user op).
    Address,
}

static COMMS: RwLock<Vec<usize>> = RwLock::new(Vec::new());
static ADDRESSES: RwLock<Vec<usize>> = RwLock::new(Vec::new());

fn table(which: Table) -> &'static RwLock<Vec<usize>> {
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
    if let Some(at) = table(which)
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .position(|&r| r == raw)
    {
        return at as i64 + 1;
    }
    let mut values = table(which).write().unwrap_or_else(|p| p.into_inner());
    let at = match values.iter().position(|&r| r == raw) {
        Some(at) => at,
        None => {
            values.push(raw);
            values.len() - 1
        }
    };
    at as i64 + 1
}

/// The raw value of `id`, if this process registered it.
pub fn resolve(which: Table, id: i64) -> Option<usize> {
    if id == 0 {
        return Some(0);
    }
    let values = table(which).read().unwrap_or_else(|p| p.into_inner());
    usize::try_from(id - 1)
        .ok()
        .and_then(|i| values.get(i).copied())
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
