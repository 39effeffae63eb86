//! Line charts as self-contained SVG for reports (miss-ratio curves, time series):
//! readable axes with units, one coloured series per VM, and a legend.

use plotters::prelude::*;

/// One named line.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend label.
    pub name: String,
    /// (x, y) points in drawing order.
    pub points: Vec<(f64, f64)>,
}

/// A line chart of `series` as an SVG document.
pub fn line_chart_svg(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    y_range: Option<(f64, f64)>,
) -> Result<String, String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (900, 560)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let xs = series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
        let ys = series.iter().flat_map(|s| s.points.iter().map(|p| p.1));
        let x_max = xs.fold(0.0f64, f64::max).max(1e-9);
        let (y_lo, y_hi) = y_range.unwrap_or_else(|| (0.0, ys.fold(0.0f64, f64::max).max(1e-9) * 1.05));
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 22))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..x_max, y_lo..y_hi)
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .x_desc(x_label)
            .y_desc(y_label)
            .axis_desc_style(("sans-serif", 16))
            .label_style(("sans-serif", 13))
            .draw()
            .map_err(|e| e.to_string())?;
        for (i, s) in series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            chart
                .draw_series(LineSeries::new(s.points.iter().copied(), color.stroke_width(2)))
                .map_err(|e| e.to_string())?
                .label(s.name.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 14))
            .draw()
            .map_err(|e| e.to_string())?;
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_an_svg_with_labels() {
        let s = Series { name: "vm-a".into(), points: vec![(0.0, 1.0), (1.0, 0.5), (2.0, 0.2)] };
        let svg = line_chart_svg("MRC", "cache size (GiB)", "miss ratio", &[s], Some((0.0, 1.0))).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("vm-a") && svg.contains("cache size (GiB)"));
    }
}
