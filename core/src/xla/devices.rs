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

/// The world rank of the process that owns `device`.
pub fn owner(device: i64) -> Result<i32> {
    let owners = OWNERS.get().ok_or_else(|| {
        Error::library(
            "devices",
            "XLA's collectives reached jaxmpi before the job's devices were given (call \
             jaxmpi.distributed.initialize before running sharded programs)",
        )
    })?;
    owners.get(&device).copied().ok_or_else(|| {
        Error::invalid_argument(
            "devices",
            format!("device {device} is not one of this job's devices"),
        )
    })
}
