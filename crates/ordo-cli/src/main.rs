//! The `ordo` command.
//!
//! ```text
//! ordo [-f|--foreground] [--keep-privileges | --user U] [--model M] [--workers N]
//!      [--cores L] [--io-cores L] IFNAME               # userspace WireGuard, as wg-quick expects
//! ordo up [--keep-privileges | --user U] [--inner tun|stack] CONFIG|NAME   # wg-quick up
//! ordo down CONFIG|NAME                                # wg-quick down
//! ordo run -c CONFIG | --attach [OWNER:]NAME -- CMD [ARGS...]  # CMD uses the tunnel: no root, no TUN
//! ordo show [IFNAME] [--all|--json]                    # wg show, plus Ordo's placement and warnings
//! ordo top [IFNAME]                                     # a live view: CPUs, stages, peers, warnings
//! ordo doctor [IFNAME] [--outer DEV]... [--json]        # what on this host slows or breaks the tunnel
//! ordo genkey | ordo pubkey                            # keys, as wg genkey / wg pubkey
//! ordo bench [--model M] [--peers N] [--size B] [--workers T]  # the data plane in memory
//! ordo loadgen setup|run|sink ...                      # N WireGuard clients against a server
//! ordo fleet NAME add|remove|list ...                  # a fleet's peers, in etcd
//! ```

use ordo::daemon::janitor::{self, FileIdentity};
use ordo::daemon::privileges::Privileges;
use ordo::placement::model::Model;
use ordo::settings::{InterfaceSettings, SETTINGS};
use ordo::{daemon, quick, show, uapi};
use ordo_tools::{bench, loadgen};

mod fleet;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use std::io::Read;

#[derive(Parser)]
#[command(
    name = "ordo",
    version,
    about = "A user-space, multi-core, WireGuard-compatible VPN data plane"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Bring up an interface from a wg-quick file (NAME means /etc/wireguard/NAME.conf).
    Up {
        config: String,
        /// Keep every capability and the user instead of dropping to CAP_NET_ADMIN and
        /// CAP_NET_BIND_SERVICE as an unprivileged user.
        #[arg(long)]
        keep_privileges: bool,
        /// The user the daemon becomes after setup when started as root (default: $ORDO_USER,
        /// else nobody; `root` keeps uid 0 with the capabilities dropped).
        #[arg(long, conflicts_with = "keep_privileges")]
        user: Option<String>,
        /// The inner side: `tun` (a TUN device, root) or `stack` (Ordo's own TCP/IP stack,
        /// which programs join with `ordo run --attach NAME`; any user). Overrides the file's
        /// `Inner =` and $ORDO_INNER.
        #[arg(long)]
        inner: Option<ordo::config::wgquick::InnerKind>,
        /// A stack interface: stay in the foreground instead of detaching.
        #[arg(long, hide = true)]
        foreground: bool,
    },
    /// Take down an interface brought up with `ordo up`.
    Down { config: String },
    /// Run a program whose connections to the tunnel's addresses go through a private
    /// interface made from a wg-quick file, with Ordo's own TCP/IP stack: no root, no TUN.
    #[command(group(clap::ArgGroup::new("interface").required(true).args(["config", "attach"])))]
    Run {
        /// The wg-quick file of a private interface for the program (Address is the
        /// program's address in the tunnel).
        #[arg(short = 'c', long)]
        config: Option<std::path::PathBuf>,
        /// Attach to the running stack interface NAME (`ordo up` of a file with
        /// `Inner = stack`) instead; OWNER:NAME for another user's that lets this one
        /// (`AttachUsers =`).
        #[arg(long, value_name = "[OWNER:]NAME")]
        attach: Option<String>,
        /// The program and its arguments, after `--`.
        #[arg(last = true, required = true)]
        command: Vec<std::ffi::OsString>,
    },
    /// Show interfaces as `wg show` does, with each peer's placement and a short Ordo section
    /// (paths, cores by stage, drops, warnings).
    Show {
        ifname: Option<String>,
        /// Every counter as well.
        #[arg(long)]
        all: bool,
        /// Machine-readable output, every figure.
        #[arg(long)]
        json: bool,
    },
    /// A live view of an interface: CPUs, stages, peers, warnings, every second.
    Top { ifname: Option<String> },
    /// What on this host slows or breaks a WireGuard gateway, each finding with what was read,
    /// why it matters and the fix; exits 1 when a problem is found.
    Doctor {
        /// The Ordo interface (its port, MTU, queue CPUs and drops are read over its socket).
        ifname: Option<String>,
        /// An outer interface to check (repeatable; default: the default routes' interfaces).
        #[arg(long = "outer")]
        outers: Vec<String>,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Benchmark the data plane on in-memory I/O against the AEAD ceiling of this machine.
    Bench {
        /// Peers of the server data plane.
        #[arg(long, default_value_t = 1)]
        peers: usize,
        /// Inner packet size in bytes.
        #[arg(long, default_value_t = 1420)]
        size: usize,
        /// Crypto workers (0: one per core).
        #[arg(long, default_value_t = 0)]
        workers: usize,
        /// Packets per phase and round.
        #[arg(long, default_value_t = 200_000)]
        packets: usize,
        /// Rounds of each phase, each beside its own ceilings; the figures are medians.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Execution model: pool, inline, threaded or auto.
        #[arg(long, default_value = "pool")]
        model: Model,
        /// Compare data planes given this many CPUs each (in the pool models as many
        /// workers, unless --workers is set) and the first's work per thread (peers and
        /// packets scaled), in one run, rounds interleaved: e.g. 1,2.
        #[arg(long, value_delimiter = ',')]
        threads: Vec<usize>,
        #[arg(long)]
        json: bool,
    },
    /// A fleet's peers in etcd: added, removed or listed here, taken by every gateway of the
    /// fleet (`Fleet = NAME`).
    Fleet(fleet::FleetArgs),
    /// Play N WireGuard clients against a server under test.
    #[command(subcommand)]
    Loadgen(loadgen::LoadgenCommand),
    /// The lab's reports (lab/lab.sh runs the scenarios).
    #[command(subcommand)]
    Lab(LabCommand),
    /// Print a new private key (base64).
    Genkey,
    /// Read a private key on stdin, print its public key.
    Pubkey,
    /// Internal: started by the daemon to remove its UAPI socket once it ends.
    #[command(name = janitor::SUBCOMMAND, hide = true)]
    UapiJanitor {
        path: std::path::PathBuf,
        dev: u64,
        ino: u64,
        changed: i64,
    },
}

#[derive(Subcommand)]
enum LabCommand {
    /// Figures (SVG) and report.md from a lab run's results.jsonl in DIR.
    Report {
        dir: std::path::PathBuf,
        /// many-clients or inversion.
        #[arg(long)]
        scenario: String,
    },
}

/// The xplatform form: `ordo [-f|--foreground] [--keep-privileges | --user U] [data-plane
/// flags] IFNAME`.
/// wg-quick runs plain `ordo IFNAME`, so the data-plane settings also come from the
/// environment (ORDO_MODEL and the others of `SETTINGS`); flags win over the environment.
fn xplatform(args: &[String]) -> Option<Result<()>> {
    let mut foreground = false;
    let mut keep = false;
    let mut user = None;
    let mut name = None;
    let mut flags: Vec<(&str, &str)> = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-f" | "--foreground" => foreground = true,
            "--keep-privileges" => keep = true,
            "--user" => {
                let Some(v) = it.next() else {
                    return Some(Err(anyhow::anyhow!("--user needs a value")));
                };
                user = Some(v.clone());
            }
            s if s.starts_with("--") && SETTINGS.iter().any(|(n, _, _)| *n == &s[2..]) => {
                let Some(v) = it.next() else {
                    return Some(Err(anyhow::anyhow!("{s} needs a value")));
                };
                flags.push((&s[2..], v.as_str()));
            }
            s if !s.starts_with('-') && name.is_none() => name = Some(s.to_string()),
            _ => return None,
        }
    }
    let name = name?;
    if [
        "up",
        "down",
        "show",
        "top",
        "doctor",
        "bench",
        "loadgen",
        "fleet",
        "lab",
        "genkey",
        "pubkey",
        "help",
        janitor::SUBCOMMAND,
    ]
    .contains(&name.as_str())
    {
        return None;
    }
    let config = (|| -> Result<InterfaceSettings> {
        let mut c = InterfaceSettings::from_env().map_err(anyhow::Error::msg)?;
        for (k, v) in flags {
            c.set(k, v).map_err(|e| anyhow::anyhow!("--{k}: {e}"))?;
        }
        Ok(c)
    })();
    let privileges = Privileges::from_flags(keep, user);
    Some(config.and_then(|config| {
        if foreground {
            ordo::interface::run_tun(&name, &privileges, &config)
        } else {
            daemon::spawn_detached(&name, &privileges, &config.to_args())
        }
    }))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match xplatform(&args) {
        Some(r) => r,
        None => run(Cli::parse()),
    };
    if let Err(e) = result {
        eprintln!("ordo: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Up {
            config,
            keep_privileges,
            user,
            inner,
            foreground,
        } => quick::up(
            &config,
            &Privileges::from_flags(keep_privileges, user),
            inner,
            foreground,
        ),
        Command::Down { config } => quick::down(&config),
        Command::Run {
            config,
            attach,
            command,
        } => {
            let code = match (config, attach) {
                (Some(config), _) => ordo::run::run(&config, &command)?,
                (None, Some(name)) => ordo::run::run_attached(&name, &command)?,
                (None, None) => unreachable!("clap requires one"),
            };
            std::process::exit(code);
        }
        Command::Top { ifname } => ordo_tools::top::run(ifname),
        Command::Doctor { ifname, outers, json } => {
            let ctx = ordo_tools::doctor::Context::read(ifname.as_deref(), outers)?;
            let findings = ordo_tools::doctor::examine(&ctx);
            if json {
                println!("{}", serde_json::to_string_pretty(&findings)?);
            } else {
                print!("{}", ordo_tools::doctor::render(&findings));
            }
            if findings
                .iter()
                .any(|f| f.severity == ordo_tools::doctor::Severity::Problem)
            {
                std::process::exit(1);
            }
            Ok(())
        }
        Command::Show { ifname, all, json } => {
            let names = match ifname {
                Some(n) => vec![n],
                None => uapi::client::list_interfaces(),
            };
            let shows = names.iter().map(|n| show::fetch(n)).collect::<Result<Vec<_>>>()?;
            if json {
                println!("{}", serde_json::to_string_pretty(&shows)?);
            } else {
                let render = if all { show::render_all } else { show::render };
                let texts: Vec<String> = shows.iter().map(render).collect();
                print!("{}", texts.join("\n"));
            }
            Ok(())
        }
        Command::Bench {
            peers,
            size,
            workers,
            packets,
            rounds,
            model,
            threads,
            json,
        } => {
            let o = bench::Options {
                model,
                topology: None,
                peers,
                size,
                workers,
                packets,
                rounds,
            };
            if !threads.is_empty() {
                let c = bench::compare(&o, &threads)?;
                if json {
                    println!("{}", serde_json::to_string_pretty(&c)?);
                } else {
                    print!("{}", bench::render_comparison(&c));
                }
                return Ok(());
            }
            let r = bench::run(&o)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                print!("{}", bench::render(&r));
            }
            Ok(())
        }
        Command::Loadgen(cmd) => loadgen::command(cmd),
        Command::Fleet(args) => fleet::run(args),
        Command::Lab(LabCommand::Report { dir, scenario }) => ordo_tools::lab::report(&dir, &scenario),
        Command::Genkey => {
            let k = ordo_proto::PrivateKey::generate(&mut rand_core::OsRng);
            println!("{}", k.to_base64().as_str());
            Ok(())
        }
        Command::Pubkey => {
            let mut s = zeroize::Zeroizing::new(String::new());
            std::io::stdin().read_to_string(&mut s).context("reading stdin")?;
            let Ok(k) = ordo_proto::PrivateKey::from_base64(s.trim()) else {
                bail!("stdin is not a base64 private key")
            };
            println!("{}", k.public_key().to_base64());
            Ok(())
        }
        Command::UapiJanitor {
            path,
            dev,
            ino,
            changed,
        } => janitor::run(&path, FileIdentity { dev, ino, changed }),
    }
}

// Packet buffers are allocated by the dispatching threads and freed by the workers; glibc's
// allocator handles such cross-thread frees poorly, mimalloc well (BENCHMARKS.md, "Allocator").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
