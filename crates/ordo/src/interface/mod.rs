//! An Ordo interface as a whole: its settings ([`settings`]), the one order in which any
//! interface comes up and goes down ([`lifecycle`]), and the two kinds whose inner side is
//! Ordo's own TCP/IP stack: a private one in this process ([`stack`], for `ordo run`) and a
//! shared one that programs attach to ([`shared`], `ordo up` of an `Inner = stack` file).

pub mod settings;
pub mod shared;
pub mod stack;
