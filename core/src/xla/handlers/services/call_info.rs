//! How a call is named where it fails or is shown: as a user would name it (`CallInfo`:
//! its communicator or MeshComm, peers or root, tags, size, or the JAX operation an XLA
//! collective came from) and by its rank (`with_rank`). The generic path names every
//! failed call so (`handlers/entry.rs`), the monitor every call it shows
//! (`lifecycle.rs`), a request its start and completion (`handlers/requests/`).

use std::fmt;

use crate::xla::frame::{handles, Call, PEER_ANY, PEER_NULL, TAG_ANY};
use crate::xla::handlers::signature::Signature;
use crate::xla::mesh::is_mesh_comm;
use crate::{Error, Library};

/// Attributes that say whom a call talks to, in the order they are shown.
const DESCRIBED: [&str; 6] = ["root", "dest", "source", "tag", "sendtag", "recvtag"];

/// One call as a user would name it: its communicator, peers or root, tags and size.
pub struct CallInfo {
    comm: usize,
    /// On a MeshComm: its id, and the call's device and rank there.
    on_devices: Option<(i64, i64, Option<usize>)>,
    attrs: [Option<i64>; DESCRIBED.len()],
    bytes: usize,
    /// The JAX operation an XLA collective came from.
    origin: Option<String>,
}

impl CallInfo {
    pub fn of(call: &Call) -> Self {
        let id = call.optional_i64("comm");
        CallInfo {
            comm: id
                .and_then(|id| handles::resolve(handles::Table::Comm, id))
                .unwrap_or(0),
            on_devices: id.filter(|&id| is_mesh_comm(id)).map(|id| {
                let device = call.device().unwrap_or(-1);
                (-id - 1, device, call.device_rank())
            }),
            // A peer given per rank (on a MeshComm): the call's rank's.
            attrs: DESCRIBED.map(|name| {
                call.optional_i64(name)
                    .or_else(|| call.device_rank().and(call.per_rank_i64(name).ok()))
            }),
            bytes: call.operand_bytes(
                Signature::named(call.name()).is_some_and(|(s, _)| s.operands.len() == 1),
            ),
            origin: call.optional_text("origin").map(str::to_string),
        }
    }
}

impl CallInfo {
    /// The bytes the call sends (or can receive).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Its communicator's handle (0 on a MeshComm).
    pub fn comm(&self) -> usize {
        self.comm
    }

    /// On a MeshComm: its number and the call's device.
    pub fn mesh_comm(&self) -> Option<(i64, i64)> {
        self.on_devices.map(|(comm, device, _)| (comm, device))
    }
}

impl fmt::Display for CallInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(origin) = &self.origin {
            return write!(f, "from {origin}, {} bytes", self.bytes);
        }
        match self.on_devices {
            Some((comm, device, Some(rank))) => {
                write!(f, "MeshComm {comm}, rank {rank} (device {device})")?
            }
            Some((comm, device, None)) => write!(f, "MeshComm {comm}, device {device}")?,
            None => write!(f, "comm {:#x}", self.comm)?,
        }
        for (name, value) in DESCRIBED.iter().zip(self.attrs) {
            let Some(value) = value else { continue };
            let is_tag = name.ends_with("tag");
            match value {
                v if is_tag && v == i64::from(TAG_ANY) => write!(f, ", {name} ANY_TAG")?,
                v if !is_tag && v == i64::from(PEER_ANY) => write!(f, ", {name} ANY_SOURCE")?,
                v if !is_tag && v == i64::from(PEER_NULL) => write!(f, ", {name} PROC_NULL")?,
                v => write!(f, ", {name} {v}")?,
            }
        }
        write!(f, ", {} bytes", self.bytes)
    }
}

/// Errors that did not come from MPI do not name the rank yet; a user with 100 ranks
/// needs it.
pub fn with_rank(err: Error, library: &dyn Library) -> Error {
    if err.mpi_class().is_some() {
        return err;
    }
    match library.comm_rank(library.world()) {
        Ok(rank) => err.context(format!("rank {rank}")),
        Err(_) => err,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_names_its_comm_peers_tags_and_bytes_as_mpi_does() {
        let mut attrs = [None; DESCRIBED.len()];
        attrs[2] = Some(i64::from(PEER_ANY)); // source
        attrs[3] = Some(i64::from(TAG_ANY)); // tag
        let info = CallInfo {
            comm: 0x4400_0000,
            on_devices: None,
            attrs,
            bytes: 16,
            origin: None,
        };
        assert_eq!(
            info.to_string(),
            "comm 0x44000000, source ANY_SOURCE, tag ANY_TAG, 16 bytes"
        );
        attrs = [
            Some(0),
            Some(i64::from(PEER_NULL)),
            None,
            Some(3),
            None,
            None,
        ];
        let info = CallInfo { attrs, ..info };
        assert_eq!(
            info.to_string(),
            "comm 0x44000000, root 0, dest PROC_NULL, tag 3, 16 bytes"
        );
        let info = CallInfo {
            on_devices: Some((0, 6, Some(3))),
            ..info
        };
        assert_eq!(
            info.to_string(),
            "MeshComm 0, rank 3 (device 6), root 0, dest PROC_NULL, tag 3, 16 bytes"
        );
    }
}
