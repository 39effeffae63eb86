//! Charts as self-contained SVG for reports (miss-ratio curves, time series, comparisons):
//! readable axes with compact tick labels, a colour-blind-safe palette with a marker shape
//! per series (so lines that coincide stay distinguishable and a one-point series still
//! shows), optional log x axis, vertical markers (phase boundaries) and bar charts.

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// One named line.
#[derive(Debug, Clone, Default)]
pub struct Series {
    /// Legend label.
    pub name: String,
    /// (x, y) points in drawing order.
    pub points: Vec<(f64, f64)>,
    /// Palette index (default: the series' position), so related series share a colour.
    pub color: Option<usize>,
    /// Drawn thin and without markers: a reference line (a target) beside measured ones.
    pub reference: bool,
}

impl Series {
    /// A series with default style.
    pub fn new(name: impl Into<String>, points: Vec<(f64, f64)>) -> Series {
        Series { name: name.into(), points, ..Series::default() }
    }
}

/// How a chart is drawn beyond its data.
#[derive(Debug, Clone, Default)]
pub struct ChartOptions {
    /// y range (default: 0 to 5% above the largest value).
    pub y_range: Option<(f64, f64)>,
    /// Logarithmic x axis (all x > 0).
    pub log_x: bool,
    /// Vertical lines at these x, with a label each (phase boundaries).
    pub vlines: Vec<(f64, String)>,
}

/// Tableau 10 with its yellow moved last: distinct for colour-blind readers and in print;
/// then four darker tones (teal, indigo, olive, wine) so a report of up to 14 series (the
/// policy comparison's) repeats no colour. With the four marker shapes, a (colour, shape)
/// pair repeats only after 56 series.
const PALETTE: [(u8, u8, u8); 14] = [
    (78, 121, 167),
    (242, 142, 43),
    (225, 87, 89),
    (118, 183, 178),
    (89, 161, 79),
    (176, 122, 161),
    (255, 157, 167),
    (156, 117, 95),
    (186, 176, 172),
    (237, 201, 72),
    (0, 109, 119),
    (68, 51, 136),
    (128, 128, 0),
    (136, 34, 85),
];

/// The palette colour `i` (wrapping).
pub fn color(i: usize) -> RGBColor {
    let (r, g, b) = PALETTE[i % PALETTE.len()];
    RGBColor(r, g, b)
}

/// A tick label without noise: `500000` → `500k`, `0.25`, `12`, `1.5M`.
pub fn tick(v: f64) -> String {
    let a = v.abs();
    let trim = |s: String| if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_string() } else { s };
    if a >= 1e6 {
        trim(format!("{:.2}", v / 1e6)) + "M"
    } else if a >= 1e4 {
        trim(format!("{:.1}", v / 1e3)) + "k"
    } else if a >= 100.0 || v == v.round() {
        format!("{v:.0}")
    } else {
        trim(format!("{v:.3}"))
    }
}

/// A value printed over a bar: three significant digits (`29.7`, `268`, `0.125`), large
/// values as [`tick`] writes them.
pub fn bar_value(v: f64) -> String {
    let a = v.abs();
    if a >= 1e4 || a == 0.0 {
        return tick(v);
    }
    let decimals = (2 - a.log10().floor() as i32).max(0) as usize;
    let s = format!("{v:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// A line chart of `series` as an SVG document (0 to the data's maximum on x).
pub fn line_chart_svg(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    y_range: Option<(f64, f64)>,
) -> Result<String, String> {
    chart_svg(title, x_label, y_label, series, &ChartOptions { y_range, ..ChartOptions::default() })
}

/// Plot area of a chart (900 × 560 less margins, axis label areas and caption), pixels.
const PLOT_PX: (f64, f64) = (800.0, 455.0);

/// The share of the plot area's width and height the legend box takes: a row of ~20 px
/// per series, ~8 px per character of the longest label plus the sample line.
fn legend_box(series: &[Series]) -> (f64, f64) {
    let chars = series.iter().map(|s| s.name.chars().count()).max().unwrap_or(0) as f64;
    let w = (40.0 + 8.0 * chars) / PLOT_PX.0;
    let h = (10.0 + 20.0 * series.len() as f64) / PLOT_PX.1;
    (w.clamp(0.1, 1.0), h.clamp(0.1, 1.0))
}

/// The corner of the plot with the fewest data points under where the legend would sit
/// (a box as large as the legend itself, [`legend_box`]: a 13-series legend covers over
/// half the plot's height, so a fixed quadrant would miss points it hides), and how
/// many points it would hide there.
fn legend_corner(series: &[Series], x_max: f64, log_x: bool, (y_lo, y_hi): (f64, f64)) -> (SeriesLabelPosition, usize) {
    let x_min = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .filter(|&x| !log_x || x > 0.0)
        .fold(f64::INFINITY, f64::min);
    let fx = |x: f64| {
        if log_x {
            (x.max(1e-12).ln() - x_min.ln()) / (x_max.ln() - x_min.ln()).max(1e-12)
        } else {
            x / x_max
        }
    };
    let fy = |y: f64| (y - y_lo) / (y_hi - y_lo).max(1e-12);
    let corners = [
        (SeriesLabelPosition::UpperRight, true, true),
        (SeriesLabelPosition::UpperLeft, false, true),
        (SeriesLabelPosition::LowerRight, true, false),
        (SeriesLabelPosition::LowerLeft, false, false),
    ];
    let (w, h) = legend_box(series);
    let count = |right: bool, top: bool| {
        series
            .iter()
            .flat_map(|s| s.points.iter())
            .filter(|p| {
                let (x, y) = (fx(p.0), fy(p.1));
                (if right { x >= 1.0 - w } else { x <= w }) && (if top { y >= 1.0 - h } else { y <= h })
            })
            .count()
    };
    corners
        .into_iter()
        .map(|(pos, r, t)| (pos, count(r, t)))
        .min_by_key(|c| c.1)
        .unwrap_or((SeriesLabelPosition::UpperRight, 0))
}

/// The y range and legend corner of a chart: where every corner would hide points and
/// the range is automatic, the top of the range is raised until the legend fits above
/// the data (so no point sits under it).
fn legend_layout(
    series: &[Series],
    x_max: f64,
    log_x: bool,
    (y_lo, y_hi): (f64, f64),
    auto: bool,
) -> ((f64, f64), SeriesLabelPosition) {
    let (pos, hidden) = legend_corner(series, x_max, log_x, (y_lo, y_hi));
    if hidden == 0 || !auto {
        return ((y_lo, y_hi), pos);
    }
    let (_, h) = legend_box(series);
    let raised = y_lo + (y_hi - y_lo) / (1.0 - h - 0.03).max(0.2);
    let (pos, _) = legend_corner(series, x_max, log_x, (y_lo, raised));
    ((y_lo, raised), pos)
}

/// The outline of marker shape `k` around (0, 0), in pixels: octagon, triangle, square,
/// diamond.
fn shape_points(k: usize) -> Vec<(i32, i32)> {
    match k % 4 {
        0 => vec![(-2, -5), (2, -5), (5, -2), (5, 2), (2, 5), (-2, 5), (-5, 2), (-5, -2)],
        1 => vec![(0, -6), (5, 4), (-5, 4)],
        2 => vec![(-4, -4), (4, -4), (4, 4), (-4, 4)],
        _ => vec![(0, -6), (6, 0), (0, 6), (-6, 0)],
    }
}

/// A line chart of `series` with `opts`, as an SVG document.
pub fn chart_svg(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    opts: &ChartOptions,
) -> Result<String, String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (900, 560)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let xs = || series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
        let ys = series.iter().flat_map(|s| s.points.iter().map(|p| p.1));
        let x_max = xs().fold(0.0f64, f64::max).max(1e-9);
        let auto = opts.y_range.unwrap_or_else(|| (0.0, ys.fold(0.0f64, f64::max).max(1e-9) * 1.05));
        let ((y_lo, y_hi), legend_at) = legend_layout(series, x_max, opts.log_x, auto, opts.y_range.is_none());
        let mut builder = ChartBuilder::on(&root);
        builder.caption(title, ("sans-serif", 22)).margin(15).x_label_area_size(45).y_label_area_size(70);
        let err = |e: &dyn std::fmt::Display| e.to_string();
        macro_rules! draw {
            ($chart:expr) => {{
                let mut chart = $chart;
                chart
                    .configure_mesh()
                    .x_desc(x_label)
                    .y_desc(y_label)
                    .x_label_formatter(&|v| tick(*v))
                    .y_label_formatter(&|v| tick(*v))
                    .axis_desc_style(("sans-serif", 16))
                    .label_style(("sans-serif", 13))
                    .draw()
                    .map_err(|e| err(&e))?;
                for (x, label) in &opts.vlines {
                    let grey = RGBColor(120, 120, 120);
                    chart
                        .draw_series(std::iter::once(PathElement::new(
                            vec![(*x, y_lo), (*x, y_hi)],
                            grey.stroke_width(1),
                        )))
                        .map_err(|e| err(&e))?;
                    chart
                        .draw_series(std::iter::once(Text::new(
                            label.clone(),
                            (*x, y_hi),
                            ("sans-serif", 12).into_font().color(&grey),
                        )))
                        .map_err(|e| err(&e))?;
                }
                for (i, s) in series.iter().enumerate() {
                    let c = color(s.color.unwrap_or(i));
                    let width = if s.reference { 1 } else { 2 };
                    let shape = i;
                    let a = chart
                        .draw_series(LineSeries::new(s.points.iter().copied(), c.stroke_width(width)))
                        .map_err(|e| err(&e))?;
                    if s.reference {
                        a.label(s.name.clone())
                            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(1)));
                    } else {
                        // The legend shows the series' own marker shape.
                        let legend_shape: Vec<(i32, i32)> =
                            shape_points(shape).into_iter().map(|(dx, dy)| (dx + 9, dy)).collect();
                        a.label(s.name.clone()).legend(move |(x, y)| {
                            EmptyElement::at((x, y))
                                + PathElement::new(vec![(0, 0), (18, 0)], c.stroke_width(2))
                                + Polygon::new(legend_shape.clone(), c.filled())
                        });
                        // At most ~40 markers per series, evenly spaced.
                        let step = s.points.len().div_ceil(40).max(1);
                        let pts: Vec<(f64, f64)> = s.points.iter().copied().step_by(step).collect();
                        let outline = shape_points(shape);
                        chart
                            .draw_series(
                                pts.iter().map(|&p| EmptyElement::at(p) + Polygon::new(outline.clone(), c.filled())),
                            )
                            .map_err(|e| err(&e))?;
                    }
                }
                chart
                    .configure_series_labels()
                    .position(legend_at)
                    .background_style(WHITE.mix(0.85))
                    .border_style(BLACK)
                    .label_font(("sans-serif", 14))
                    .draw()
                    .map_err(|e| err(&e))?;
            }};
        }
        if opts.log_x {
            let x_min = xs().filter(|&x| x > 0.0).fold(f64::INFINITY, f64::min).min(x_max);
            // Ticks at the data's own x values (cache sizes), when there are few.
            let mut keys: Vec<f64> = xs().filter(|&x| x > 0.0).collect();
            keys.sort_by(f64::total_cmp);
            keys.dedup();
            let range = (x_min * 0.8..x_max * 1.25).log_scale();
            if keys.len() <= 12 {
                draw!(builder.build_cartesian_2d(range.with_key_points(keys), y_lo..y_hi).map_err(|e| err(&e))?);
            } else {
                draw!(builder.build_cartesian_2d(range, y_lo..y_hi).map_err(|e| err(&e))?);
            }
        } else {
            draw!(builder.build_cartesian_2d(0.0..x_max, y_lo..y_hi).map_err(|e| err(&e))?);
        }
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}

/// A bar chart (one bar per label, coloured by position) as an SVG document.
pub fn bar_chart_svg(title: &str, y_label: &str, bars: &[(String, f64)]) -> Result<String, String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (900, 480)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let y_max = bars.iter().map(|b| b.1).fold(0.0f64, f64::max).max(1e-9) * 1.15;
        let n = bars.len().max(1) as u32;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 22))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(70)
            .build_cartesian_2d((0u32..n - 1).into_segmented(), 0.0..y_max)
            .map_err(|e| e.to_string())?;
        let names: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
        chart
            .configure_mesh()
            .disable_x_mesh()
            .y_desc(y_label)
            .y_label_formatter(&|v| tick(*v))
            .x_label_formatter(&|v| match v {
                SegmentValue::CenterOf(i) => names.get(*i as usize).cloned().unwrap_or_default(),
                _ => String::new(),
            })
            .axis_desc_style(("sans-serif", 16))
            .label_style(("sans-serif", 14))
            .draw()
            .map_err(|e| e.to_string())?;
        let label = ("sans-serif", 15).into_font().into_text_style(&root).pos(Pos::new(HPos::Center, VPos::Bottom));
        for (i, (_, v)) in bars.iter().enumerate() {
            let i = i as u32;
            let mut bar = Rectangle::new(
                [(SegmentValue::Exact(i), 0.0), (SegmentValue::Exact(i + 1), *v)],
                color(i as usize).filled(),
            );
            bar.set_margin(0, 0, 40, 40);
            chart.draw_series(std::iter::once(bar)).map_err(|e| e.to_string())?;
            chart
                .draw_series(std::iter::once(Text::new(
                    bar_value(*v),
                    (SegmentValue::CenterOf(i), *v + y_max * 0.01),
                    label.clone(),
                )))
                .map_err(|e| e.to_string())?;
        }
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_an_svg_with_labels() {
        let s = Series::new("vm-a", vec![(0.0, 1.0), (1.0, 0.5), (2.0, 0.2)]);
        let one = Series::new("vm-b", vec![(1.0, 0.7)]);
        let svg = line_chart_svg("MRC", "cache size (GiB)", "miss ratio", &[s.clone(), one], Some((0.0, 1.0))).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("vm-a") && svg.contains("cache size (GiB)"));
        assert!(svg.contains("<polygon"), "markers are drawn (a one-point series shows)");
        let opts = ChartOptions { log_x: true, vlines: vec![(1.0, "phase 2".into())], ..ChartOptions::default() };
        let log =
            chart_svg("t", "x", "y", &[Series::new("a", vec![(16.0, 1.0), (64.0, 2.0), (256.0, 3.0)])], &opts).unwrap();
        assert!(log.contains("phase 2"));
        let bars = bar_chart_svg("SSD writes", "GiB", &[("eci".into(), 3.8), ("centaur".into(), 4.4)]).unwrap();
        assert!(bars.contains("eci") && bars.contains("4.4"));
    }

    #[test]
    fn a_tall_legend_avoids_points_a_quadrant_would_miss() {
        // 13 series: the legend is over half the plot tall. Three points at mid-height on
        // the right (under a right-hand legend, top or bottom), one near the top left.
        let mut series: Vec<Series> = (0..12).map(|i| Series::new(format!("policy-{i}"), Vec::new())).collect();
        series.push(Series::new("points", vec![(0.05, 0.95), (0.95, 0.5), (0.96, 0.5), (0.97, 0.5)]));
        let (at, _) = legend_corner(&series, 1.0, false, (0.0, 1.0));
        assert!(matches!(at, SeriesLabelPosition::LowerLeft), "{at:?}");
        // One series: a small box in the empty upper right.
        let one = [Series::new("a", vec![(0.05, 0.95), (0.95, 0.5)])];
        assert!(matches!(legend_corner(&one, 1.0, false, (0.0, 1.0)).0, SeriesLabelPosition::UpperRight));
        // Points in every corner: the automatic range is raised until the legend hides none.
        let mut crowded: Vec<Series> = (0..12).map(|i| Series::new(format!("policy-{i}"), Vec::new())).collect();
        crowded.push(Series::new("pts", vec![(0.05, 0.9), (0.95, 0.9), (0.05, 0.1), (0.95, 0.1)]));
        let ((lo, hi), at) = legend_layout(&crowded, 1.0, false, (0.0, 1.0), true);
        assert!(hi > 1.0 && lo == 0.0);
        assert_eq!(legend_corner(&crowded, 1.0, false, (lo, hi)).1, 0, "{at:?} still hides points");
        assert_eq!(legend_layout(&crowded, 1.0, false, (0.0, 1.0), false).0, (0.0, 1.0), "a fixed range stays");
    }

    #[test]
    fn ticks_are_compact() {
        assert_eq!(tick(500000.0), "500k");
        assert_eq!(tick(1_500_000.0), "1.5M");
        assert_eq!(tick(12.0), "12");
        assert_eq!(tick(0.25), "0.25");
        assert_eq!(tick(250.5), "250");
        assert_eq!(bar_value(29.738), "29.7");
        assert_eq!(bar_value(268.3), "268");
        assert_eq!(bar_value(3.84), "3.84");
        assert_eq!(bar_value(0.125), "0.125");
        assert_eq!(bar_value(2.0), "2");
        assert_eq!(bar_value(123456.0), "123.5k");
    }
}

#[cfg(test)]
mod palette_tests {
    use super::*;

    #[test]
    fn fourteen_series_get_fourteen_colours() {
        let mut seen: Vec<(u8, u8, u8)> = (0..14)
            .map(|i| {
                let c = color(i);
                (c.0, c.1, c.2)
            })
            .collect();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), 14);
    }
}
