//! Which process owns each of the job's devices: XLA's collectives name devices by their
//! global id (jax's `Device.id`), MPI names processes by rank. Python sets the table once,
//! from `jax.devices()`, when JAX's collectives are handed to jaxmpi; a process's JAX
//! index is its rank in MPI's world (`jaxmpi.distributed.initialize` makes it so).

use std::collections::HashMap;
use std::sync::OnceLock;

use crate::{Error, Result};

static OWNERS: OnceLock<HashMap<i64, i32>> = OnceLock::new();

/// Sets the owner (world rank) of every device of the job; a second call must agree.
pub fn set_owners(owners: &[(i64, i32)]) -> Result<()> {
    let table: HashMap<i64, i32> = owners.iter().copied().collect();
    if table.len() != owners.len() {
        return Err(Error::invalid_argument(
            "devices",
            "a device id is listed twice",
        ));
    }
    let set = OWNERS.get_or_init(|| table.clone());
    if *set != table {
        return Err(Error::invalid_argument(
            "devices",
            "the job's devices were already given, differently (JAX's devices do not change \
             while a job runs)",
        ));
    }
    Ok(())
}

fn table() -> Result<&'static HashMap<i64, i32>> {
    OWNERS.get().ok_or_else(|| {
        Error::library(
            "devices",
            "XLA's collectives reached jaxmpi before the job's devices were given (call \
             jaxmpi.distributed.initialize before running sharded programs)",
        )
    })
}

/// The world rank of the process that owns `device`.
pub fn owner(device: i64) -> Result<i32> {
    table()?.get(&device).copied().ok_or_else(|| {
        Error::invalid_argument(
            "devices",
            format!("device {device} is not one of this job's devices"),
        )
    })
}

/// Each device's place among its process's devices (by id), and the most devices a
/// process holds: what names a device's messages apart from its process's other devices'
/// on a communicator they share (`Group::tag`). The same on every process.
struct Slots {
    of: HashMap<i64, usize>,
    most: usize,
}

fn slots() -> Result<&'static Slots> {
    static SLOTS: OnceLock<Slots> = OnceLock::new();
    if let Some(slots) = SLOTS.get() {
        return Ok(slots);
    }
    let mut by_process: HashMap<i32, Vec<i64>> = HashMap::new();
    for (&device, &process) in table()? {
        by_process.entry(process).or_default().push(device);
    }
    let mut of = HashMap::new();
    for devices in by_process.values_mut() {
        devices.sort_unstable();
        of.extend(devices.iter().enumerate().map(|(slot, &d)| (d, slot)));
    }
    let most = by_process.values().map(Vec::len).max().unwrap_or(0);
    Ok(SLOTS.get_or_init(|| Slots { of, most }))
}

/// `device`'s place among its process's devices, ordered by id.
pub fn slot(device: i64) -> Result<usize> {
    owner(device)?;
    Ok(slots()?.of[&device])
}

/// The most devices any process of the job holds.
pub fn most_per_process() -> Result<usize> {
    Ok(slots()?.most)
}
