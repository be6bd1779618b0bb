//! `ordo top`: a live view of one interface, redrawn every second from what `ordo show` reads
//! (its UAPI socket): per CPU, the OS's time by kind beside Ordo's threads there; per stage,
//! the cores it took, its packets and how it delivered; per peer, its rates and placement; the
//! detectors' warnings. `q`, Esc or Ctrl-C leaves.

use anyhow::{Context, Result};
use ordo::device::report::InterfaceReport;
use ordo::show;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Cell, Paragraph, Row, Table, Wrap};
use ratatui::Frame;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How often the view is redrawn (the daemon's figures are per second).
const REFRESH: Duration = Duration::from_secs(1);

/// What a peer had sent and received at the last reading, to turn totals into rates.
struct Seen {
    at: Instant,
    bytes: HashMap<String, (u64, u64)>,
}

/// One reading and the rates since the one before.
struct Reading {
    show: InterfaceReport,
    /// Per peer key: received and sent bytes per second.
    rates: HashMap<String, (f64, f64)>,
}

fn read(ifname: &str, seen: &mut Option<Seen>) -> Result<Reading> {
    let show = show::fetch(ifname)?;
    let now = Instant::now();
    let mut rates = HashMap::new();
    if let Some(s) = seen.as_ref() {
        let secs = now.duration_since(s.at).as_secs_f64().max(1e-3);
        for p in &show.peers {
            if let Some(&(rx, tx)) = s.bytes.get(&p.public_key) {
                let rate = |now: u64, then: u64| now.saturating_sub(then) as f64 / secs;
                rates.insert(p.public_key.clone(), (rate(p.rx_bytes, rx), rate(p.tx_bytes, tx)));
            }
        }
    }
    *seen = Some(Seen {
        at: now,
        bytes: (show.peers.iter())
            .map(|p| (p.public_key.clone(), (p.rx_bytes, p.tx_bytes)))
            .collect(),
    });
    Ok(Reading { show, rates })
}

/// Runs the view on the terminal until the user leaves; `ifname`: the interface (the first
/// one up when None).
pub fn run(ifname: Option<String>) -> Result<()> {
    let ifname = match ifname {
        Some(n) => n,
        None => (ordo::uapi::client::list_interfaces().into_iter().next())
            .context("no interface is up (ordo top IFNAME)")?,
    };
    let mut seen = None;
    // Read once before taking the terminal: a wrong name is said on a normal screen.
    let mut reading = read(&ifname, &mut seen)?;
    let mut terminal = ratatui::init();
    let result = (|| -> Result<()> {
        loop {
            terminal.draw(|f| draw(f, &reading))?;
            let deadline = Instant::now() + REFRESH;
            while let Some(left) = deadline.checked_duration_since(Instant::now()) {
                if !event::poll(left)? {
                    break;
                }
                if let Event::Key(k) = event::read()? {
                    let ctrl_c = k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL);
                    if k.kind == KeyEventKind::Press && (matches!(k.code, KeyCode::Char('q') | KeyCode::Esc) || ctrl_c)
                    {
                        return Ok(());
                    }
                }
            }
            reading = read(&ifname, &mut seen).with_context(|| format!("{ifname} is gone"))?;
        }
    })();
    ratatui::restore();
    result
}

fn bits(bytes_per_second: f64) -> String {
    let b = bytes_per_second * 8.0;
    if b >= 1e9 {
        format!("{:.2} Gbit/s", b / 1e9)
    } else if b >= 1e6 {
        format!("{:.1} Mbit/s", b / 1e6)
    } else if b >= 1e3 {
        format!("{:.1} kbit/s", b / 1e3)
    } else {
        format!("{b:.0} bit/s")
    }
}

fn permille(x: u64) -> String {
    format!("{:.0}%", x as f64 / 10.0)
}

fn cores(milli: u64) -> String {
    format!("{:.2}", milli as f64 / 1000.0)
}

/// The rows of the CPU table: the OS's time by kind, and Ordo's threads there by each clock.
fn cpu_rows(s: &InterfaceReport) -> Vec<[String; 8]> {
    (s.cpus.iter())
        .map(|c| {
            [
                c.cpu.to_string(),
                permille(1000u64.saturating_sub(c.idle)),
                permille(c.tasks),
                permille(c.softirq),
                permille(c.irq),
                permille(c.steal),
                cores(c.ordo_clock),
                cores(c.ordo_os),
            ]
        })
        .collect()
}

/// The rows of the stage table.
fn stage_rows(s: &InterfaceReport) -> Vec<[String; 5]> {
    (s.stages.iter())
        .map(|st| {
            let per_wakeup = if st.wakeups > 0 {
                format!("{:.1}", st.pps as f64 / st.wakeups as f64)
            } else {
                "-".into()
            };
            let wasted = if st.wakeups > 0 {
                format!("{:.0}%", st.wasted as f64 * 100.0 / st.wakeups as f64)
            } else {
                "-".into()
            };
            [
                st.name.replace('_', " "),
                cores(st.millicores),
                st.pps.to_string(),
                per_wakeup,
                wasted,
            ]
        })
        .collect()
}

/// The rows of the peer table, busiest first.
fn peer_rows(f: &Reading) -> Vec<[String; 7]> {
    let mut peers: Vec<_> = f.show.peers.iter().collect();
    peers.sort_by_key(|p| std::cmp::Reverse(p.placement.as_ref().map_or(0, |pl| pl.pps)));
    (peers.into_iter())
        .map(|p| {
            let (rx, tx) = f.rates.get(&p.public_key).copied().unwrap_or_default();
            let key: String = p.public_key.chars().take(12).collect();
            let pl = p.placement.as_ref();
            [
                key,
                bits(rx),
                bits(tx),
                pl.map_or("-".into(), |pl| pl.pps.to_string()),
                pl.map_or("-".into(), |pl| cores(pl.millicores)),
                pl.map_or("-".into(), |pl| format!("{} cpu {}", pl.queue, pl.cpu)),
                pl.map_or("-".into(), |pl| pl.regime.clone()),
            ]
        })
        .collect()
}

fn table<const N: usize>(title: &str, header: [&str; N], rows: Vec<[String; N]>, widths: [u16; N]) -> Table<'static> {
    let header = Row::new(header.map(|h| Cell::from(h.to_string()))).style(Style::new().add_modifier(Modifier::BOLD));
    let rows = rows.into_iter().map(|r| Row::new(r.map(Cell::from)));
    Table::new(rows, widths.map(Constraint::Length))
        .header(header)
        .block(Block::bordered().title(title.to_string()))
}

fn draw(f: &mut Frame, reading: &Reading) {
    let s = &reading.show;
    let warnings: Vec<Line> = if s.warnings.is_empty() {
        vec![Line::from("none")]
    } else {
        s.warnings.iter().map(|w| Line::from(w.to_string())).collect()
    };
    let [head, cpus, stages, peers, warn] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(s.cpus.len() as u16 + 3),
        Constraint::Length(s.stages.len() as u16 + 3),
        Constraint::Min(4),
        Constraint::Length(warnings.len() as u16 * 2 + 2),
    ])
    .areas(f.area());
    let title = format!(
        "ordo top: {}, model {}, outer path {}, {} peer{} (q: quit)",
        s.name,
        s.model,
        if s.outer.is_empty() { "udp" } else { &s.outer },
        s.peers.len(),
        if s.peers.len() == 1 { "" } else { "s" }
    );
    f.render_widget(
        Paragraph::new(title).style(Style::new().add_modifier(Modifier::BOLD)),
        head,
    );
    f.render_widget(
        table(
            "CPUs, last second (the OS's time by kind; Ordo's threads by its clock and as the OS charged them)",
            ["CPU", "busy", "tasks", "softirq", "irq", "steal", "ordo", "ordo (OS)"],
            cpu_rows(s),
            [4, 6, 6, 8, 5, 6, 6, 10],
        ),
        cpus,
    );
    f.render_widget(
        table(
            "Stages, last second",
            ["stage", "cores", "packets/s", "per wake-up", "wasted"],
            stage_rows(s),
            [18, 6, 10, 12, 7],
        ),
        stages,
    );
    f.render_widget(
        table(
            "Peers",
            ["peer", "received", "sent", "packets/s", "cores", "queue", "regime"],
            peer_rows(reading),
            [13, 13, 13, 10, 6, 12, 12],
        ),
        peers,
    );
    f.render_widget(
        Paragraph::new(warnings)
            .wrap(Wrap { trim: true })
            .block(Block::bordered().title("Warnings")),
        warn,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use ordo::device::report::{CpuShow, PeerReport, PlacementReport, StageShow};

    #[test]
    fn rows_read_as_a_person_would() {
        let mut s = InterfaceReport::default();
        s.cpus.push(CpuShow {
            cpu: 1,
            tasks: 600,
            softirq: 150,
            idle: 250,
            ordo_clock: 420,
            ordo_os: 500,
            ..Default::default()
        });
        s.stages.push(StageShow {
            name: "deliver_inbound".into(),
            millicores: 230,
            pps: 400_000,
            wakeups: 4_000,
            wasted: 400,
            ..Default::default()
        });
        s.peers.push(PeerReport {
            public_key: "YG/FrhWGfpTLB2rTWWE/IdWpE+l4UKv4tMd+pMnpXhM=".into(),
            placement: Some(PlacementReport {
                queue: 1,
                cpu: "1".into(),
                regime: "inline".into(),
                pps: 1500,
                millicores: 250,
                ..Default::default()
            }),
            ..Default::default()
        });
        assert_eq!(
            cpu_rows(&s)[0],
            ["1", "75%", "60%", "15%", "0%", "0%", "0.42", "0.50"].map(String::from)
        );
        assert_eq!(
            stage_rows(&s)[0],
            ["deliver inbound", "0.23", "400000", "100.0", "10%"].map(String::from)
        );
        let f = Reading {
            rates: HashMap::from([(s.peers[0].public_key.clone(), (125_000_000.0, 1_000.0))]),
            show: s,
        };
        assert_eq!(
            peer_rows(&f)[0],
            [
                "YG/FrhWGfpTL",
                "1.00 Gbit/s",
                "8.0 kbit/s",
                "1500",
                "0.25",
                "1 cpu 1",
                "inline"
            ]
            .map(String::from)
        );
    }
}
