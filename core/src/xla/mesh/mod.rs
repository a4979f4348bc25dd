//! The device-rank layer: collectives among JAX devices, several of which may share a
//! process, for both routes that reach them: XLA's collectives as jaxmpi's HLO pass hands
//! them over (`handlers/hlo.rs`, an adapter per opcode) and jaxmpi's ops on a MeshComm
//! (`comm.rs`, the call's device as a rank). Nothing here reads an XLA call frame: a call
//! arrives as its device, how it names its group, and its buffers.
//!
//! - `group.rs`: a group of devices, the processes it spans, their communicators
//!   (`comm_sets.rs`: shared by the groups over the same devices, bounded);
//!   `communicators.rs`: a program's, made by its prologue (a MeshComm's: `mesh_comms.rs`);
//! - `place.rs`: a call's group and position, found once per thread;
//! - `room.rs`, `seat.rs`: where a process's devices of one group meet, call after call,
//!   and what each brings (its call, checked to be every member's);
//! - `messages.rs`, `mailbox.rs`: a meeting's messages (copies inside a process, MPI
//!   between processes);
//! - `reductions.rs`, `collectives.rs`: each collective once (those that combine, those
//!   that move), `buffers.rs` what they do with buffers; `ordered.rs`: reductions whose
//!   bits do not follow the layout; `scans.rs`: a MeshComm's prefix reductions; `ragged.rs`:
//!   XLA's ragged all-to-all;
//! - `mesh_comms.rs`, `comm.rs`, `on_devices.rs`: MeshComms, and an op's call on one.
//!
//! `docs/reference/device-ranks.md` follows a psum and a MeshComm allreduce through it.

mod buffers;
#[cfg(test)]
mod calls_bench;
pub mod collectives;
mod comm;
mod comm_sets;
mod communicators;
mod group;
mod mailbox;
mod mesh_comms;
mod messages;
mod on_devices;
mod ordered;
mod place;
#[cfg(test)]
mod planning_bench;
pub mod ragged;
pub mod reductions;
mod room;
mod scans;
mod seat;
#[cfg(test)]
mod simulated;

pub use collectives::AllToAll;
pub use comm::{OnDevices, ON_DEVICES};
pub use comm_sets::communicators_held;
pub use communicators::make_program_communicators;
pub use group::Group;
pub use mesh_comms::{is_mesh_comm, register};
pub use place::{connected, placed, Naming, Place};
pub use seat::{CallKey, Seat, Span, Spans};
