//! Execution models and placement: which threads the data plane runs, on which CPUs.
//!
//! One data plane, four ways to run it (chosen per interface: `Model =` in the config file,
//! `--model` or `ORDO_MODEL` on the command line):
//! - **pool**: receive and read threads dispatch per-peer batches to a fixed pool of crypto
//!   workers, one per crypto CPU; the worker that finishes a lane's head delivers it.
//! - **inline**: one queue per CPU (its own UDP sockets and TUN queue); a peer's datagrams
//!   are steered to its queue, and that queue's thread does everything: run to completion.
//! - **threaded**: the pool, but each peer's in-order delivery is a thread of its own woken
//!   on every finished batch, as kernel WireGuard's threaded NAPI. Kept for comparison.
//! - **auto**: inline queues, and a pool for the peers one core cannot carry, decided per
//!   peer from its measured load (see [`super::decide`]).
//!
//! Placement: `Cores` limits the CPUs used, `IoCores` names those that receive and read;
//! crypto workers go on the others, grouped by NUMA node, so that a peer's work stays on
//! one node (see [`super`] for the per-peer assignment).

use crate::host::topology::{self, format_cpu_list, Cpus, Topology};
use std::fmt;
use std::str::FromStr;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Model {
    Pool,
    Inline,
    Threaded,
    /// The default: inline, and the pool for a peer one core cannot carry. With queue threads
    /// released under contention it carried as much as pool from 1,000 clients uploading and
    /// more in every other case measured, on less CPU (BENCHMARKS.md, "Execution models").
    #[default]
    Auto,
}

impl Model {
    pub const ALL: [Model; 4] = [Model::Pool, Model::Inline, Model::Threaded, Model::Auto];

    pub fn name(self) -> &'static str {
        match self {
            Model::Pool => "pool",
            Model::Inline => "inline",
            Model::Threaded => "threaded",
            Model::Auto => "auto",
        }
    }

    /// Whether the model has a crypto pool.
    pub fn has_pool(self) -> bool {
        self != Model::Inline
    }

    /// Whether the model has one queue (sockets, TUN queue, thread) per I/O CPU.
    pub fn has_queues(self) -> bool {
        matches!(self, Model::Inline | Model::Auto)
    }
}

impl fmt::Display for Model {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Model {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Model::ALL
            .into_iter()
            .find(|m| m.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| format!("unknown model {s:?} (pool, inline, threaded or auto)"))
    }
}

/// Where the data plane's threads run, as the user asked (`Model`, `Workers`, `Cores`,
/// `IoCores`, `DeliveryFifo`, `Placement`); [`Plan::new`] resolves it against the machine.
#[derive(Clone, Debug, Default)]
pub struct PlacementSettings {
    pub model: Model,
    /// Crypto workers in the pool; 0: one per crypto CPU.
    pub workers: usize,
    /// CPUs the data plane may use; None: all the process may use.
    pub cpus: Option<Cpus>,
    /// CPUs that receive and read (and nothing else in the pool models); None: all of `cpus`.
    pub io_cpus: Option<Cpus>,
    /// The machine's topology; None: read from /sys.
    pub topology: Option<Topology>,
    /// Threaded model only: run the delivery threads at SCHED_FIFO, above the workers, to
    /// reproduce kernel WireGuard's execution order inversion on purpose (lab scenario 3).
    pub delivery_fifo: bool,
    /// Peers stay on the queue and pool they were given (no load-aware moves).
    pub fixed_placement: bool,
}

/// A crypto worker: the CPUs it may run on, and the NUMA node whose pool it serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerPlace {
    pub node: usize,
    pub cpus: Cpus,
}

/// Where every thread of the data plane runs, resolved from a [`PlacementSettings`].
#[derive(Clone, Debug)]
pub struct Plan {
    pub model: Model,
    pub cpus: Cpus,
    pub io_cpus: Cpus,
    /// One entry per queue: the CPU its thread is pinned to (inline, auto). The pool models
    /// have a single queue whose threads run on the I/O CPUs.
    pub queues: Cpus,
    /// The crypto pools, one per NUMA node holding crypto CPUs; empty for inline.
    pub pools: Vec<(usize, Vec<WorkerPlace>)>,
    /// Whether the user chose the CPUs (then workers are pinned one per CPU).
    pub explicit: bool,
    pub delivery_fifo: bool,
    /// No load-aware moves between queues and pools (`Placement = fixed`).
    pub fixed_placement: bool,
    pub topology: Topology,
}

impl Plan {
    /// Resolves a configuration against the CPUs the process may use.
    pub fn new(config: &PlacementSettings) -> Result<Plan, String> {
        Plan::resolve(config, &topology::allowed_cpus())
    }

    pub fn resolve(config: &PlacementSettings, allowed: &[usize]) -> Result<Plan, String> {
        let topology = config.topology.clone().unwrap_or_else(Topology::detect);
        let cpus: Cpus = match &config.cpus {
            Some(c) => {
                let outside: Vec<usize> = c.iter().copied().filter(|x| !allowed.contains(x)).collect();
                if !outside.is_empty() {
                    return Err(format!(
                        "Cores: CPU {} not available to this process (it may use {})",
                        format_cpu_list(&outside),
                        format_cpu_list(allowed)
                    ));
                }
                c.clone()
            }
            None => allowed.to_vec(),
        };
        let io_cpus: Cpus = match &config.io_cpus {
            Some(io) => {
                if let Some(x) = io.iter().find(|x| !cpus.contains(x)) {
                    return Err(format!(
                        "IoCores: CPU {x} is not among the data plane's CPUs ({})",
                        format_cpu_list(&cpus)
                    ));
                }
                io.clone()
            }
            None => cpus.clone(),
        };
        // Crypto keeps off the I/O CPUs when there are others (Barone et al., HPSR 2025: +14% for a heavy
        // tunnel whose receiving core does no crypto).
        let mut crypto: Cpus = cpus.iter().copied().filter(|c| !io_cpus.contains(c)).collect();
        if config.io_cpus.is_none() || crypto.is_empty() {
            crypto = cpus.clone();
        }
        let explicit = config.cpus.is_some() || config.io_cpus.is_some();
        let mut pools: Vec<(usize, Vec<WorkerPlace>)> = Vec::new();
        if config.model.has_pool() {
            let workers = if config.workers == 0 {
                crypto.len()
            } else {
                config.workers
            };
            let by_node = topology.split(&crypto);
            for i in 0..workers {
                let cpu = crypto[i % crypto.len()];
                let node = topology.node_of(cpu);
                // Unless told which CPUs to use, a worker may run anywhere on its node.
                let place_cpus = if explicit {
                    vec![cpu]
                } else {
                    by_node
                        .iter()
                        .find(|(n, _)| *n == node)
                        .map(|(_, c)| c.clone())
                        .unwrap_or_default()
                };
                let place = WorkerPlace { node, cpus: place_cpus };
                match pools.iter_mut().find(|(n, _)| *n == node) {
                    Some((_, ws)) => ws.push(place),
                    None => pools.push((node, vec![place])),
                }
            }
            pools.sort_by_key(|(n, _)| *n);
        }
        let queues = if config.model.has_queues() {
            io_cpus.clone()
        } else {
            vec![io_cpus[0]]
        };
        Ok(Plan {
            model: config.model,
            cpus,
            io_cpus,
            queues,
            pools,
            explicit,
            delivery_fifo: config.delivery_fifo,
            fixed_placement: config.fixed_placement,
            topology,
        })
    }

    /// Where queue `q`'s thread runs: its own CPU, or, while released ([`super::affinity`]), the I/O
    /// CPUs of that CPU's node.
    pub fn queue_thread_cpus(&self, q: usize, released: bool) -> Cpus {
        if released {
            self.released_cpus(q)
        } else {
            vec![self.queues[q]]
        }
    }

    /// Where queue `q`'s thread may run while released ([`super::affinity`]): the I/O CPUs of its
    /// CPU's node, so that a peer's stages stay on one node.
    pub fn released_cpus(&self, q: usize) -> Cpus {
        let node = self.topology.node_of(self.queues[q]);
        (self.topology.split(&self.io_cpus).into_iter())
            .find(|(n, _)| *n == node)
            .map_or_else(|| vec![self.queues[q]], |(_, c)| c)
    }

    /// Crypto workers in all pools.
    pub fn workers(&self) -> usize {
        self.pools.iter().map(|(_, w)| w.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::topology::tests::fake_two_nodes;

    fn two_nodes() -> Topology {
        let dir = std::env::temp_dir().join(format!("ordo-model-{}", std::process::id()));
        let t = fake_two_nodes(&dir);
        let _ = std::fs::remove_dir_all(&dir);
        t
    }

    #[test]
    fn models_parse_by_name() {
        assert_eq!(Model::default(), Model::Auto, "Ordo chooses per peer unless told");
        assert_eq!("Inline".parse::<Model>().unwrap(), Model::Inline);
        assert!("fast".parse::<Model>().unwrap_err().contains("pool, inline"));
    }

    #[test]
    fn pool_workers_are_grouped_by_node() {
        let config = PlacementSettings {
            model: Model::Pool,
            topology: Some(two_nodes()),
            ..Default::default()
        };
        let p = Plan::resolve(&config, &[0, 1, 2, 3]).unwrap();
        assert_eq!(p.queues, vec![0], "the pool model has one queue");
        assert_eq!(p.pools.len(), 2);
        let (n0, w0) = &p.pools[0];
        let (n1, w1) = &p.pools[1];
        assert_eq!((*n0, *n1), (0, 1));
        assert!(w0.iter().all(|w| w.cpus == vec![0, 2]), "{w0:?}");
        assert!(w1.iter().all(|w| w.cpus == vec![1, 3]), "{w1:?}");
        assert_eq!(p.workers(), 4);
    }

    #[test]
    fn io_cores_keep_crypto_off() {
        let config = PlacementSettings {
            model: Model::Auto,
            cpus: Some(vec![0, 1, 2, 3]),
            io_cpus: Some(vec![0]),
            topology: Some(two_nodes()),
            ..Default::default()
        };
        let p = Plan::resolve(&config, &[0, 1, 2, 3]).unwrap();
        assert_eq!(p.queues, vec![0], "auto's inline queues are the I/O CPUs");
        let crypto: Vec<usize> = p
            .pools
            .iter()
            .flat_map(|(_, w)| w.iter().flat_map(|w| w.cpus.clone()))
            .collect();
        assert_eq!(crypto, vec![2, 1, 3], "node 0's CPU 2, then node 1's");
        assert!(p.explicit);
    }

    #[test]
    fn inline_has_a_queue_per_cpu_and_no_pool() {
        let config = PlacementSettings {
            model: Model::Inline,
            topology: Some(two_nodes()),
            ..Default::default()
        };
        let p = Plan::resolve(&config, &[0, 1]).unwrap();
        assert_eq!(p.queues, vec![0, 1]);
        assert!(p.pools.is_empty());
        // Released under contention, a queue's thread stays on its node (0,2 and 1,3).
        let p = Plan::resolve(&config, &[0, 1, 2, 3]).unwrap();
        assert_eq!((p.released_cpus(0), p.released_cpus(3)), (vec![0, 2], vec![1, 3]));
    }

    #[test]
    fn bad_cpus_are_named() {
        let config = PlacementSettings {
            cpus: Some(vec![0, 7]),
            ..Default::default()
        };
        let e = Plan::resolve(&config, &[0, 1]).unwrap_err();
        assert!(e.contains("CPU 7 not available"), "{e}");
        let config = PlacementSettings {
            cpus: Some(vec![0]),
            io_cpus: Some(vec![1]),
            ..Default::default()
        };
        let e = Plan::resolve(&config, &[0, 1]).unwrap_err();
        assert!(e.contains("IoCores: CPU 1"), "{e}");
    }
}
