//! The machine's CPUs as the data plane sees them: which it may use, which NUMA node each
//! belongs to, and pinning a thread to some of them.
//!
//! The topology is read from sysfs under a root that a test can replace with a fake tree,
//! so the NUMA rules can be tested on a one-node machine (LESSONS rule 5).

use std::collections::BTreeSet;
use std::io;
use std::path::Path;

/// A set of CPU numbers, kept sorted.
pub type Cpus = Vec<usize>;

/// CPUs a `cpu_set_t` holds (glibc's CPU_SETSIZE): pinning takes no CPU beyond it.
pub const MAX_CPUS: usize = 1024;

/// Parses a kernel CPU list such as `0-3,8,10-11` (also the syntax of the `Cores` setting).
/// CPU numbers are bounded, not range widths: any list that parses formats
/// ([`format_cpu_list`]) to one that parses to the same set.
pub fn parse_cpu_list(s: &str) -> Result<Cpus, String> {
    let mut set = BTreeSet::new();
    for part in s.trim().split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let num = |x: &str| match x.trim().parse::<usize>() {
            Ok(n) if n < MAX_CPUS => Ok(n),
            Ok(_) => Err(format!("CPU {x:?} is beyond the {MAX_CPUS} a CPU set holds")),
            Err(_) => Err(format!("{x:?} is not a CPU number")),
        };
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if a > b {
                    return Err(format!("bad CPU range {part:?}"));
                }
                set.extend(a..=b);
            }
            None => {
                set.insert(num(part)?);
            }
        }
    }
    if set.is_empty() {
        return Err("empty CPU list".into());
    }
    Ok(set.into_iter().collect())
}

/// Formats CPUs as a kernel CPU list (`0-3,8`).
pub fn format_cpu_list(cpus: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            cpus[i].to_string()
        } else {
            format!("{}-{}", cpus[i], cpus[j])
        });
        i = j + 1;
    }
    out.join(",")
}

/// NUMA nodes and their CPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    /// (node number, its CPUs), by node number.
    pub nodes: Vec<(usize, Cpus)>,
}

impl Topology {
    /// Reads `devices/system/node/node*/cpulist` under `sys` (normally `/sys`). A machine
    /// without that tree (no NUMA support) is one node holding every online CPU.
    pub fn from_sysfs(sys: &Path) -> io::Result<Topology> {
        let mut nodes = Vec::new();
        if let Ok(dir) = std::fs::read_dir(sys.join("devices/system/node")) {
            for e in dir.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let Some(n) = name.strip_prefix("node").and_then(|n| n.parse::<usize>().ok()) else {
                    continue;
                };
                let list = std::fs::read_to_string(e.path().join("cpulist"))?;
                // A node with memory only has an empty list.
                if let Ok(cpus) = parse_cpu_list(&list) {
                    nodes.push((n, cpus));
                }
            }
        }
        if nodes.is_empty() {
            let online = std::fs::read_to_string(sys.join("devices/system/cpu/online"))?;
            let cpus = parse_cpu_list(&online).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            nodes.push((0, cpus));
        }
        nodes.sort();
        Ok(Topology { nodes })
    }

    /// The machine's own topology; one node of the allowed CPUs if sysfs cannot be read.
    pub fn detect() -> Topology {
        Topology::read(Path::new("/sys"))
    }

    /// The topology under `sys`; one node of the allowed CPUs if it cannot be read.
    pub fn read(sys: &Path) -> Topology {
        Topology::from_sysfs(sys).unwrap_or_else(|_| Topology {
            nodes: vec![(0, allowed_cpus())],
        })
    }

    /// The node of a CPU (the first node if the CPU is unknown).
    pub fn node_of(&self, cpu: usize) -> usize {
        self.nodes
            .iter()
            .find(|(_, cpus)| cpus.contains(&cpu))
            .map_or(self.nodes.first().map_or(0, |n| n.0), |n| n.0)
    }

    /// `cpus` grouped by node, leaving out nodes with none of them.
    pub fn split(&self, cpus: &[usize]) -> Vec<(usize, Cpus)> {
        let mut out: Vec<(usize, Cpus)> = Vec::new();
        for &c in cpus {
            let n = self.node_of(c);
            match out.iter_mut().find(|(node, _)| *node == n) {
                Some((_, v)) => v.push(c),
                None => out.push((n, vec![c])),
            }
        }
        out.sort();
        out
    }
}

/// The CPUs the calling thread may run on (at start-up: those of the process).
pub fn allowed_cpus() -> Cpus {
    thread_cpus(0).unwrap_or_else(|_| {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        (0..n).collect()
    })
}

/// The CPUs thread `tid` of this process may run on (0: the calling thread).
pub fn thread_cpus(tid: i32) -> io::Result<Cpus> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity writes at most its size.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let rc = unsafe { libc::sched_getaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: CPU_ISSET reads the set we own, within CPU_SETSIZE.
    Ok((0..libc::CPU_SETSIZE as usize)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

/// Pins the calling thread to `cpus`. Failure (a CPU outside the cgroup, say) is reported
/// and the thread runs where the OS puts it.
pub fn pin_current_thread(cpus: &[usize]) -> io::Result<()> {
    pin_thread(0, cpus)
}

/// Pins thread `tid` of this process (0: the calling thread) to `cpus`.
pub fn pin_thread(tid: i32, cpus: &[usize]) -> io::Result<()> {
    // SAFETY: cpu_set_t is plain data.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
        // SAFETY: c is below CPU_SETSIZE; the set is ours.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: a valid set of its own size; the kernel checks that `tid` exists.
    let rc = unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Found by the cpu_list fuzz target: `0-4000,4001-4376` parsed (each range under the
    /// old width limit) but formatted as `0-4376`, which did not; a daemon given it in
    /// `Cores` would have passed on a list its child refuses. CPU numbers are bounded now.
    #[test]
    fn every_list_that_parses_formats_to_one_that_parses() {
        assert!(parse_cpu_list("0-1000,1001-1023").is_ok());
        let all = parse_cpu_list("0-1000,1001-1023").unwrap();
        assert_eq!(parse_cpu_list(&format_cpu_list(&all)), Ok(all));
        assert!(parse_cpu_list("0-4000,4001-4376").unwrap_err().contains("beyond"));
        assert!(parse_cpu_list("1024").is_err());
    }

    #[test]
    fn cpu_lists_parse_and_format() {
        assert_eq!(parse_cpu_list("0-3,8, 10-11\n").unwrap(), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(parse_cpu_list("2,1,2").unwrap(), vec![1, 2]);
        assert!(parse_cpu_list("").is_err());
        assert!(parse_cpu_list("3-1").is_err());
        assert!(parse_cpu_list("a").unwrap_err().contains("\"a\""));
        assert_eq!(format_cpu_list(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(format_cpu_list(&[5]), "5");
    }

    /// A fake sysfs tree with two nodes, as on a two-socket machine.
    pub fn fake_two_nodes(root: &Path) -> Topology {
        for (n, list) in [(0, "0,2\n"), (1, "1,3\n")] {
            let d = root.join(format!("devices/system/node/node{n}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("cpulist"), list).unwrap();
        }
        // A memory-only node is ignored.
        let d = root.join("devices/system/node/node2");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("cpulist"), "\n").unwrap();
        Topology::from_sysfs(root).unwrap()
    }

    #[test]
    fn reads_nodes_from_an_injected_sysfs() {
        let dir = std::env::temp_dir().join(format!("ordo-topology-{}", std::process::id()));
        let t = fake_two_nodes(&dir);
        assert_eq!(t.nodes, vec![(0, vec![0, 2]), (1, vec![1, 3])]);
        assert_eq!(t.node_of(3), 1);
        assert_eq!(t.split(&[0, 1, 2]), vec![(0, vec![0, 2]), (1, vec![1])]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn this_machine_has_a_topology_covering_its_cpus() {
        let t = Topology::from_sysfs(Path::new("/sys")).unwrap();
        for c in allowed_cpus() {
            assert!(t.nodes.iter().any(|(_, cpus)| cpus.contains(&c)), "CPU {c} in no node");
        }
    }

    #[test]
    fn pinning_restricts_the_thread() {
        let first = allowed_cpus()[0];
        std::thread::spawn(move || {
            pin_current_thread(&[first]).unwrap();
            assert_eq!(
                allowed_cpus(),
                vec![first],
                "allowed_cpus reads the calling thread's set"
            );
        })
        .join()
        .unwrap();
    }

    #[test]
    fn another_thread_is_pinned_and_released_by_its_id() {
        let all = allowed_cpus();
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            tx.send(unsafe { libc::gettid() }).unwrap();
            done_rx.recv().unwrap();
            allowed_cpus()
        });
        let tid = rx.recv().unwrap();
        pin_thread(tid, &all[..1]).unwrap();
        assert_eq!(thread_cpus(tid).unwrap(), all[..1].to_vec());
        pin_thread(tid, &all).unwrap();
        assert_eq!(thread_cpus(tid).unwrap(), all);
        pin_thread(tid, &all[..1]).unwrap();
        done_tx.send(()).unwrap();
        assert_eq!(t.join().unwrap(), all[..1].to_vec(), "the thread itself sees the set");
        assert!(pin_thread(-5, &all).is_err(), "no such thread");
    }
}
