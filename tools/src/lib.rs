//! hairpin's tools that are not tests: the bench (`cargo xtask bench`, binary
//! `hairpin-bench`) and the demo (`cargo xtask demo`, binary `hairpin-demo`). Both
//! run on the simulated node of the test crate's library (`hairpin_tests::node`),
//! so the suites and the tools build one node the same way.

pub mod bench;
