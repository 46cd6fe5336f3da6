//! The datapath's lifecycle as one typed state machine: what a starting agent finds
//! on the node (a pin directory locked or busy, an earlier agent's datapath of its
//! layout or of another), what it finds at each hook, and what a stopping one
//! decides; and what it does about each.
//!
//! - state.rs: the observed states and the actions, plain data;
//! - decide.rs: pure functions from one to the other, unit-tested without root
//!   (tests.rs), and the one consumers-first order;
//! - start.rs: the start's observation and decision;
//! - execute.rs: the executor, the links' owner and the only code that changes links
//!   and pins; hook.rs, its steps at one hook; takeover.rs, its hand-over of another
//!   layout's live datapath; kernel.rs, its seam over the kernel, which unit tests
//!   replace (fake.rs, executor_tests.rs).
//!
//! Waiting (for the lock, or for another layout's datapath to expire) is a state the
//! agent reports, never an error. The transition table, each row with the test that
//! pins it, is in docs/architecture.md ("The lifecycle").
//!
//! Owns the order of every link change. Never writes a map entry (maps.rs and
//! liveness.rs own those) and never loads a program (load.rs).

pub(crate) mod decide;
pub(crate) mod execute;
pub(crate) mod hook;
pub(crate) mod kernel;
pub(crate) mod start;
pub(crate) mod state;
pub(crate) mod takeover;

pub(crate) use state::{Removal, Stop, StopSeen, Wait};

#[cfg(test)]
mod executor_tests;
#[cfg(test)]
mod fake;
#[cfg(test)]
mod tests;
