//! Non-blocking ops: the machinery behind every op's started form (`started iname` in the
//! table in `handlers/mod.rs`) and its `wait`. `nonblocking.rs` is the op side (a start
//! runs the op's own body with every MPI call started, the request value, the wait's
//! body); the requests then live in a table (`flights.rs`) between their start and their
//! wait (`in_flight.rs`), completed meanwhile by the progress agent (`agent.rs`) where
//! this rank has one to spare (`progress.rs`).
//!
//! Files import downward in that order: `nonblocking` → `in_flight` → `agent` →
//! `flights` (`nonblocking` builds the flight it starts); `progress` is read by
//! `nonblocking` and the agent. A started receive's completion reuses the blocking
//! receive's checks (`handlers/received.rs`).

mod agent;
mod flights;
pub mod in_flight;
pub mod nonblocking;
pub mod progress;
