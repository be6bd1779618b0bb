//! The host's facilities below the data plane: its CPUs and NUMA nodes and how to pin a thread
//! ([`topology`], from sysfs), how busy each CPU and thread was ([`cpuload`], from /proc), and
//! wake-ups for backends without a descriptor of their own ([`wakeup`], eventfd).

pub mod cpuload;
pub mod topology;
pub mod wakeup;
