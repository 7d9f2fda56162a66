//! perf-chart: draws `docs/perf.svg` from the figures `scripts/perf.sh`
//! measured. `scripts/perf/report.py` writes them as JSON beside
//! `docs/perf.md`; this tool reads that file and writes an SVG of two
//! panels of grouped bars: bandwidth by message size (a bar per side: raw TCP,
//! the kernel's RDS-TCP, ours) and one-way latency (grouped: the VM rig,
//! the host loopback). A figure that was not measured (`null`) is left out
//! of the bars: an empty bar labelled "missing" stands in its place.
//!
//! Usage: `perf-chart FIGURES.json OUT.svg`
//!
//! The input:
//!
//! ```json
//! { "caption": "scripts/perf.sh at abc1234, 2026-11-24 18:00 UTC",
//!   "bandwidth": { "title": "...", "sizes": ["1 KiB", "8 KiB", "64 KiB"],
//!                  "series": [ { "name": "raw TCP", "values": [35.5, 109.0, null] } ] },
//!   "latency":   { "title": "...",
//!                  "bars": [ { "group": "VM rig", "name": "raw TCP", "value": 98.1 } ] } }
//! ```
//!
//! Bandwidth values are in MB/s, latencies in microseconds.

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde_json::Value;

const HELP: &str = "usage: perf-chart FIGURES.json OUT.svg

Draws the chart of scripts/perf.sh (docs/perf.svg) from the figures
scripts/perf/report.py wrote (docs/perf.json): bandwidth by message size
and one-way latency bars. Exit status 1 when the input is unreadable.";

/// The label of a figure that was not measured.
const MISSING: &str = "missing";

/// The whole picture.
const SIZE: (u32, u32) = (1100, 480);

/// One line of the bandwidth panel.
#[derive(Debug, PartialEq)]
struct Series {
    name: String,
    values: Vec<Option<f64>>,
}

/// One bar of the latency panel.
#[derive(Debug, PartialEq)]
struct Bar {
    group: String,
    name: String,
    value: Option<f64>,
}

/// What the chart shows, read from the JSON.
#[derive(Debug, PartialEq)]
struct Figures {
    caption: String,
    bw_title: String,
    sizes: Vec<String>,
    series: Vec<Series>,
    lat_title: String,
    bars: Vec<Bar>,
}

fn text(v: &Value, key: &str) -> String {
    v.get(key).and_then(Value::as_str).unwrap_or("").to_string()
}

/// A number, or `None` for `null`, a missing key or anything not a finite
/// non-negative number.
fn figure(v: Option<&Value>) -> Option<f64> {
    v.and_then(Value::as_f64).filter(|x| x.is_finite() && *x >= 0.0)
}

fn parse(json: &str) -> Result<Figures, String> {
    let v: Value = serde_json::from_str(json).map_err(|e| format!("bad JSON: {e}"))?;
    let bw = v.get("bandwidth").ok_or("no \"bandwidth\"")?;
    let lat = v.get("latency").ok_or("no \"latency\"")?;
    let sizes: Vec<String> = bw
        .get("sizes")
        .and_then(Value::as_array)
        .ok_or("no \"bandwidth.sizes\"")?
        .iter()
        .map(|s| s.as_str().unwrap_or("?").to_string())
        .collect();
    let mut series = Vec::new();
    for s in bw.get("series").and_then(Value::as_array).ok_or("no \"bandwidth.series\"")? {
        let vals = s.get("values").and_then(Value::as_array).ok_or("a series without \"values\"")?;
        if vals.len() != sizes.len() {
            return Err(format!("series {:?}: {} values for {} sizes", text(s, "name"), vals.len(), sizes.len()));
        }
        series.push(Series { name: text(s, "name"), values: vals.iter().map(|x| figure(Some(x))).collect() });
    }
    let bars = lat
        .get("bars")
        .and_then(Value::as_array)
        .ok_or("no \"latency.bars\"")?
        .iter()
        .map(|b| Bar { group: text(b, "group"), name: text(b, "name"), value: figure(b.get("value")) })
        .collect();
    Ok(Figures {
        caption: text(&v, "caption"),
        bw_title: text(bw, "title"),
        sizes,
        series,
        lat_title: text(lat, "title"),
        bars,
    })
}

/// The colour of a side, the same in both panels.
fn colour(name: &str) -> RGBColor {
    let n = name.to_ascii_lowercase();
    if n.contains("raw") {
        RGBColor(90, 110, 140)
    } else if n.contains("kernel") {
        RGBColor(230, 130, 30)
    } else if n.contains("ours") && (n.contains("rds-gen") || n.contains("tools")) {
        // Ours measured with our own tools: a lighter shade of ours.
        RGBColor(150, 210, 160)
    } else if n.contains("ours") {
        RGBColor(40, 160, 80)
    } else {
        RGBColor(150, 80, 160)
    }
}

/// "1,234" or "12.3": the label of a figure.
fn label(x: f64) -> String {
    if x >= 100.0 { format!("{x:.0}") } else { format!("{x:.1}") }
}

/// The top of an axis: a little above the largest figure (1 when none).
fn axis_top(xs: impl Iterator<Item = f64>) -> f64 {
    let m = xs.fold(0.0f64, f64::max);
    if m > 0.0 { m * 1.18 } else { 1.0 }
}

fn draw(f: &Figures, out: &str) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(out, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(&f.caption, ("sans-serif", 18))?;
    let (left, right) = root.split_horizontally(SIZE.0 * 55 / 100);
    // Bandwidth: a group of bars per message size, a bar per side.
    let bw: Vec<Group> = f
        .sizes
        .iter()
        .enumerate()
        .map(|(i, size)| Group {
            name: size.clone(),
            bars: f.series.iter().map(|s| (s.name.clone(), s.values[i])).collect(),
        })
        .collect();
    let legend: Vec<&str> = f.series.iter().map(|s| s.name.as_str()).collect();
    bars_panel(&left, &f.bw_title, "MB/s", &bw, false, &legend)?;
    // Latency: a group per place (VM rig, host), a bar per side.
    let mut lat: Vec<Group> = Vec::new();
    for b in &f.bars {
        match lat.last_mut() {
            Some(g) if g.name == b.group => g.bars.push((b.name.clone(), b.value)),
            _ => lat.push(Group { name: b.group.clone(), bars: vec![(b.name.clone(), b.value)] }),
        }
    }
    bars_panel(&right, &f.lat_title, "one-way latency, us", &lat, true, &[])?;
    root.present()?;
    Ok(())
}

/// Bars side by side under one name (a message size, a place).
struct Group {
    name: String,
    bars: Vec<(String, Option<f64>)>,
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

/// A panel of grouped bars: each bar in its side's colour with its figure
/// on top (an empty bar labelled "missing" when not measured), the bar's
/// side under it when `names_under_bars`, the group's name under those, and
/// a legend of `legend`'s sides in the upper left when not empty.
fn bars_panel(
    area: &Area,
    title: &str,
    y_desc: &str,
    groups: &[Group],
    names_under_bars: bool,
    legend: &[&str],
) -> Result<(), Box<dyn std::error::Error>> {
    const GAP: f64 = 0.7;
    let mut slots: Vec<(f64, &str, Option<f64>)> = Vec::new();
    let mut centres: Vec<(f64, &str)> = Vec::new();
    let mut x = 0.0;
    for (gi, g) in groups.iter().enumerate() {
        if gi > 0 {
            x += GAP;
        }
        let first = x;
        for (name, v) in &g.bars {
            slots.push((x, name.as_str(), *v));
            x += 1.0;
        }
        centres.push(((first + x - 0.2) / 2.0, g.name.as_str()));
    }
    let (lo, hi) = (-0.3, x.max(1.0) + 0.1);
    // Room above the bars for the legend.
    let top = axis_top(slots.iter().filter_map(|s| s.2)) * if legend.is_empty() { 1.0 } else { 1.3 };
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 17))
        .margin(12)
        .x_label_area_size(if names_under_bars { 48 } else { 30 })
        .y_label_area_size(60)
        .build_cartesian_2d(lo..hi, 0f64..top)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .max_light_lines(0)
        .y_label_formatter(&|v| format!("{v:.0}"))
        .y_desc(y_desc)
        .draw()?;
    let figure_font = ("sans-serif", 13).into_font().color(&BLACK).pos(Pos::new(HPos::Center, VPos::Bottom));
    let missing_font = ("sans-serif", 11).into_font().color(&BLACK).pos(Pos::new(HPos::Center, VPos::Bottom));
    for &(x0, name, v) in &slots {
        let c = colour(name);
        let (x1, x2) = (x0, x0 + 0.8);
        let mid = (x1 + x2) / 2.0;
        let (bar, text, h, font) = match v {
            Some(v) => (Rectangle::new([(x1, 0.0), (x2, v)], c.filled()), label(v), v, &figure_font),
            None => (
                Rectangle::new([(x1, 0.0), (x2, top * 0.04)], c.stroke_width(1)),
                MISSING.to_string(),
                top * 0.04,
                &missing_font,
            ),
        };
        chart.draw_series(std::iter::once(bar))?;
        chart.draw_series(std::iter::once(Text::new(text, (mid, h + top * 0.01), font.clone())))?;
    }
    for &name in legend {
        let c = colour(name);
        chart
            .draw_series(std::iter::empty::<Rectangle<(f64, f64)>>())?
            .label(name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], c.filled()));
    }
    if !legend.is_empty() {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .label_font(("sans-serif", 14))
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK.mix(0.3))
            .draw()?;
    }
    // Names under the axis, in pixels of the whole panel.
    let (px, py) = chart.plotting_area().get_pixel_range();
    let base = area.get_base_pixel();
    let px_of = |v: f64| px.start - base.0 + ((v - lo) / (hi - lo) * f64::from(px.end - px.start)) as i32;
    let y0 = py.end - base.1 + 5;
    let small = ("sans-serif", 13).into_font().color(&BLACK).pos(Pos::new(HPos::Center, VPos::Top));
    let bold = ("sans-serif", 15).into_font().color(&BLACK).pos(Pos::new(HPos::Center, VPos::Top));
    if names_under_bars {
        for &(x0, name, _) in &slots {
            area.draw_text(name, &small, (px_of(x0 + 0.4), y0))?;
        }
    }
    for &(cx, name) in &centres {
        area.draw_text(name, &bold, (px_of(cx), if names_under_bars { y0 + 20 } else { y0 }))?;
    }
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{HELP}");
        return;
    }
    if args.len() != 2 {
        eprintln!("{HELP}");
        std::process::exit(2);
    }
    let json = std::fs::read_to_string(&args[0]).unwrap_or_else(|e| fail(&format!("{}: {e}", args[0])));
    let figs = parse(&json).unwrap_or_else(|e| fail(&format!("{}: {e}", args[0])));
    if let Err(e) = draw(&figs, &args[1]) {
        fail(&format!("{}: {e}", args[1]));
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("perf-chart: {msg}");
    std::process::exit(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"{
        "caption": "scripts/perf.sh at abc1234",
        "bandwidth": { "title": "Bandwidth (VM rig)", "sizes": ["1 KiB", "8 KiB", "64 KiB"],
            "series": [
                { "name": "raw TCP", "values": [35.5, 109.0, 253.0] },
                { "name": "kernel RDS-TCP", "values": [15.0, 64.7, 190.0] },
                { "name": "ours", "values": [17.0, null, 71.3] } ] },
        "latency": { "title": "Latency 64 B",
            "bars": [
                { "group": "VM rig", "name": "raw TCP", "value": 98.1 },
                { "group": "VM rig", "name": "kernel RDS-TCP", "value": 143.0 },
                { "group": "VM rig", "name": "ours", "value": 704.3 },
                { "group": "host loopback", "name": "raw TCP", "value": 24.7 },
                { "group": "host loopback", "name": "ours", "value": null } ] } }"#;

    #[test]
    fn parses_figures_and_keeps_missing_ones_missing() {
        let f = parse(SAMPLE).unwrap();
        assert_eq!(f.sizes, ["1 KiB", "8 KiB", "64 KiB"]);
        assert_eq!(f.series.len(), 3);
        assert_eq!(f.series[2].name, "ours");
        assert_eq!(f.series[2].values, [Some(17.0), None, Some(71.3)]);
        assert_eq!(f.bars.len(), 5);
        assert_eq!(f.bars[3], Bar { group: "host loopback".into(), name: "raw TCP".into(), value: Some(24.7) });
        assert_eq!(f.bars[4].value, None);
    }

    #[test]
    fn refuses_a_series_of_the_wrong_length() {
        let bad = SAMPLE.replace("[35.5, 109.0, 253.0]", "[35.5, 109.0]");
        let e = parse(&bad).unwrap_err();
        assert!(e.contains("2 values for 3 sizes"), "{e}");
        assert!(parse("{").unwrap_err().starts_with("bad JSON"));
        assert!(parse(r#"{"bandwidth": {"sizes": [], "series": []}}"#).unwrap_err().contains("latency"));
    }

    #[test]
    fn draws_every_figure_label_and_name() {
        let f = parse(SAMPLE).unwrap();
        let out = std::env::temp_dir().join(format!("perf-chart-test-{}.svg", std::process::id()));
        draw(&f, out.to_str().unwrap()).unwrap();
        let svg = std::fs::read_to_string(&out).unwrap();
        std::fs::remove_file(&out).unwrap();
        // The texts of the <text> elements, trimmed, in order.
        let texts: Vec<&str> = svg
            .split("<text")
            .skip(1)
            .map(|t| t[t.find('>').unwrap() + 1..t.find("</text>").unwrap()].trim())
            .collect();
        let count = |w: &str| texts.iter().filter(|t| **t == w).count();
        assert!(svg.starts_with("<svg"), "{}", &svg[..40.min(svg.len())]);
        for want in [
            "Bandwidth (VM rig)",
            "Latency 64 B",
            "scripts/perf.sh at abc1234",
            "1 KiB",
            "8 KiB",
            "64 KiB",
            "VM rig",
            "host loopback",
        ] {
            assert_eq!(count(want), 1, "{want:?} in {texts:?}");
        }
        // Every figure on its bar, in order: bandwidth by size then side,
        // then latency; the two missing ones labelled.
        let figs: Vec<&str> = texts.iter().copied().filter(|t| t.parse::<f64>().is_ok() || *t == MISSING).collect();
        let want = [
            "35.5", "15.0", "17.0", "109", "64.7", MISSING, "253", "190", "71.3", "98.1", "143", "704", "24.7", MISSING,
        ];
        let mut rest = figs.iter();
        for w in want {
            assert!(rest.any(|f| *f == w), "{w} missing or out of order in {figs:?}");
        }
        assert_eq!(count(MISSING), 2);
        assert_eq!(count("not measured"), 0);
        // Each side's name: in the legend, and under each of its latency bars.
        assert_eq!(count("ours"), 3);
        assert_eq!(count("kernel RDS-TCP"), 2);
        assert_eq!(count("raw TCP"), 3);
        // Ten filled bars, three in ours' colour (two figures and the legend), one outline.
        assert_eq!(svg.matches("fill=\"#28A050\"").count(), 4, "ours' bars and legend");
        assert_eq!(svg.matches("stroke=\"#28A050\"").count(), 2, "the two empty bars of ours");
    }

    #[test]
    fn labels_are_short() {
        assert_eq!(label(17.04), "17.0");
        assert_eq!(label(253.4), "253");
        assert_eq!(axis_top([].into_iter()), 1.0);
        assert!((axis_top([10.0, 100.0].into_iter()) - 118.0).abs() < 1e-9);
    }
}
