//! The lab report's figures as SVG (plotters): line charts against clients or time, per-core
//! bars, and the axes and legends they share.

use super::Lines;
use anyhow::Result;
use plotters::prelude::*;
use std::path::Path;

/// A number as an axis shows it: whole numbers without decimals, others with as few as
/// tell them apart (plotters' default prints "500.0" and "0.30000000000000004").
pub(super) fn tick(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        let s = format!("{v:.2}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// A duration unit for values measured in microseconds, so that a chart reads "600 ms" and
/// not "600000.0 microseconds".
pub(super) struct TimeUnit {
    divisor: f64,
    name: &'static str,
}

pub(super) fn time_unit(max_us: f64) -> TimeUnit {
    if max_us >= 1e6 {
        TimeUnit {
            divisor: 1e6,
            name: "seconds",
        }
    } else if max_us >= 1e3 {
        TimeUnit {
            divisor: 1e3,
            name: "milliseconds",
        }
    } else {
        TimeUnit {
            divisor: 1.0,
            name: "microseconds",
        }
    }
}

/// Lines of microseconds in the unit their largest value reads best in, and its name.
pub(super) fn in_time_unit(lines: &Lines) -> (Lines, &'static str) {
    let max = lines.values().flatten().map(|p| p.1).fold(0.0f64, f64::max);
    let unit = time_unit(max);
    let scaled = (lines.iter())
        .map(|(k, pts)| (k.clone(), pts.iter().map(|&(x, y)| (x, y / unit.divisor)).collect()))
        .collect();
    (scaled, unit.name)
}

/// The colour of series `i`: Okabe and Ito's palette, which people with colour-blindness
/// tell apart, its yellow (hard to see on white) last.
pub(super) fn series_color(i: usize) -> RGBAColor {
    const OKABE_ITO: [(u8, u8, u8); 8] = [
        (0, 114, 178),
        (213, 94, 0),
        (0, 158, 115),
        (204, 121, 167),
        (230, 159, 0),
        (86, 180, 233),
        (0, 0, 0),
        (240, 228, 66),
    ];
    let (r, g, b) = OKABE_ITO[i % OKABE_ITO.len()];
    RGBColor(r, g, b).to_rgba()
}

/// Width of the legend beside a chart: the legend never covers the data.
pub(super) const LEGEND_WIDTH: u32 = 150;

/// One series in a legend: its name, its colour, and whether it is drawn as bars.
pub(super) struct LegendEntry {
    name: String,
    color: RGBAColor,
    bar: bool,
}

/// The legend, in its own area right of the chart: a mark and a name per series.
pub(super) fn legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    entries: &[LegendEntry],
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    for (i, e) in entries.iter().enumerate() {
        let y = 50 + i as i32 * 22;
        if e.bar {
            area.draw(&Rectangle::new([(6, y - 6), (20, y + 6)], e.color.filled()))?;
        } else {
            area.draw(&PathElement::new(vec![(4, y), (22, y)], e.color.stroke_width(2)))?;
        }
        area.draw(&Text::new(e.name.clone(), (28, y - 7), ("sans-serif", 13)))?;
    }
    Ok(())
}

/// A line chart over a logarithmic x axis (clients, tunnels or flows).
pub(super) fn line_chart(file: &Path, title: &str, y_label: &str, lines: &Lines) -> Result<()> {
    line_chart_x(file, title, "clients", y_label, lines)
}

pub(super) fn line_chart_x(file: &Path, title: &str, x_label: &str, y_label: &str, lines: &Lines) -> Result<()> {
    let root = SVGBackend::new(file, (720 + LEGEND_WIDTH, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let (plot, side) = root.split_horizontally(720);
    let xs = lines.values().flatten().map(|p| p.0);
    let (x_min, x_max) = xs.fold((f64::MAX, 1.0f64), |(a, b), x| (a.min(x), b.max(x)));
    let y_max = lines.values().flatten().map(|p| p.1).fold(0.0f64, f64::max).max(1e-6) * 1.15;
    let mut chart = ChartBuilder::on(&plot)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((x_min.max(1.0) * 0.8..x_max * 1.25).log_scale(), 0.0..y_max)?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| tick(*y))
        .draw()?;
    let mut entries = Vec::new();
    for (i, (name, pts)) in lines.iter().enumerate() {
        let color = series_color(i);
        chart.draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?;
        chart.draw_series(pts.iter().map(|&(x, y)| Circle::new((x, y), 3, color.filled())))?;
        entries.push(LegendEntry {
            name: name.clone(),
            color,
            bar: false,
        });
    }
    legend(&side, &entries)?;
    root.present()?;
    Ok(())
}

/// Bars of each CPU's busy share, grouped by implementation.
pub(super) fn core_chart(file: &Path, title: &str, rows: &[(String, Vec<f64>)]) -> Result<()> {
    let root = SVGBackend::new(file, (720 + LEGEND_WIDTH, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let (plot, side) = root.split_horizontally(720);
    let cores = rows.iter().map(|r| r.1.len()).max().unwrap_or(1).max(1);
    let slots = rows.len() * (cores + 1);
    let mut chart = ChartBuilder::on(&plot)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..slots as f64, 0f64..100f64)?;
    let names: Vec<String> = rows.iter().map(|r| r.0.clone()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .y_desc("busy, % of the CPU")
        .y_label_formatter(&|y| tick(*y))
        .x_labels(slots + 1)
        .x_label_formatter(&|x| {
            let slot = (*x as usize) / (cores + 1);
            if (*x as usize) % (cores + 1) == cores / 2 {
                names.get(slot).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .draw()?;
    let mut entries = Vec::new();
    for c in 0..cores {
        let color = series_color(c);
        chart.draw_series(rows.iter().enumerate().filter_map(|(i, (_, busy))| {
            let x = (i * (cores + 1) + c) as f64;
            busy.get(c)
                .map(|b| Rectangle::new([(x + 0.1, 0.0), (x + 0.9, b * 100.0)], color.filled()))
        }))?;
        entries.push(LegendEntry {
            name: format!("CPU {c}"),
            color,
            bar: true,
        });
    }
    legend(&side, &entries)?;
    root.present()?;
    Ok(())
}

/// A line over time (linear axes).
pub(super) fn time_chart(file: &Path, title: &str, y_label: &str, pts: &[(f64, f64)]) -> Result<()> {
    let root = SVGBackend::new(file, (720, 360)).into_drawing_area();
    root.fill(&WHITE)?;
    let x_max = pts.iter().map(|p| p.0).fold(1.0f64, f64::max);
    let y_max = pts.iter().map(|p| p.1).fold(1e-6f64, f64::max) * 1.15;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc(y_label)
        .x_label_formatter(&|x| tick(*x))
        .y_label_formatter(&|y| tick(*y))
        .draw()?;
    chart.draw_series(LineSeries::new(pts.to_vec(), series_color(0).stroke_width(2)))?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axes_read_as_people_write_numbers() {
        assert_eq!(tick(500.0), "500");
        assert_eq!(tick(0.30000000000000004), "0.3");
        assert_eq!(tick(2.5), "2.5");
        assert_eq!(tick(12.25), "12.2");
        // 600,000 microseconds read as 600 milliseconds.
        let lines = Lines::from([("ordo".to_string(), vec![(10.0, 600_000.0), (100.0, 250_000.0)])]);
        let (ms, unit) = in_time_unit(&lines);
        assert_eq!(unit, "milliseconds");
        assert_eq!(ms["ordo"], vec![(10.0, 600.0), (100.0, 250.0)]);
        assert_eq!(
            in_time_unit(&Lines::from([("x".to_string(), vec![(1.0, 2.5e6)])])).1,
            "seconds"
        );
        assert_eq!(
            in_time_unit(&Lines::from([("x".to_string(), vec![(1.0, 400.0)])])).1,
            "microseconds"
        );
    }
}
