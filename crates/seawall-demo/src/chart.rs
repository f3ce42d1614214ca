//! The herd's chart: retries per 100 ms over time, one series per strategy,
//! as a hand-written SVG.

use std::fmt::Write as _;

use crate::herd::{Series, BUCKET};

const WIDTH: f64 = 960.0;
const HEIGHT: f64 = 480.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 24.0;
const TOP: f64 = 56.0;
const BOTTOM: f64 = 56.0;

/// Renders `series` (retries per bucket) for `clients` clients.
pub(crate) fn render(series: &[Series], clients: usize) -> String {
    let buckets = series
        .iter()
        .map(|s| s.buckets.len())
        .max()
        .unwrap_or(0)
        .max(1);
    let per_second = (1_000 / BUCKET.as_millis()) as usize;
    let seconds = buckets.div_ceil(per_second).max(1);
    let top = series.iter().map(|s| s.peak().0).max().unwrap_or(0).max(1);
    let step = nice_step(top);
    let y_max = top.div_ceil(step) * step;

    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let x = |bucket: usize| LEFT + plot_w * bucket as f64 / (seconds * per_second) as f64;
    let y = |n: u32| TOP + plot_h * (1.0 - f64::from(n) / f64::from(y_max));

    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        svg,
        r#"<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>"#
    );
    let _ = writeln!(
        svg,
        r#"<text x="{LEFT}" y="24" font-size="15" font-weight="bold">{clients} clients fail at t = 0 and retry after 1 s, 2 s, 4 s: retries per 100 ms</text>"#
    );

    // Grid and axes.
    let _ = writeln!(svg, r##"<g stroke="#ddd" stroke-width="1">"##);
    for n in (0..=y_max).step_by(step as usize) {
        let _ = writeln!(
            svg,
            r#"<line x1="{LEFT}" y1="{0:.1}" x2="{1:.1}" y2="{0:.1}"/>"#,
            y(n),
            WIDTH - RIGHT
        );
    }
    for s in 0..=seconds {
        let _ = writeln!(
            svg,
            r#"<line x1="{0:.1}" y1="{TOP}" x2="{0:.1}" y2="{1:.1}"/>"#,
            x(s * per_second),
            TOP + plot_h
        );
    }
    let _ = writeln!(svg, "</g>");
    let _ = writeln!(
        svg,
        r##"<path d="M{LEFT},{TOP} V{0:.1} H{1:.1}" fill="none" stroke="#333" stroke-width="1.5"/>"##,
        TOP + plot_h,
        WIDTH - RIGHT
    );
    let _ = writeln!(svg, r#"<g text-anchor="end">"#);
    for n in (0..=y_max).step_by(step as usize) {
        let _ = writeln!(
            svg,
            r#"<text x="{0:.1}" y="{1:.1}">{n}</text>"#,
            LEFT - 6.0,
            y(n) + 4.0
        );
    }
    let _ = writeln!(svg, "</g>");
    let _ = writeln!(svg, r#"<g text-anchor="middle">"#);
    for s in 0..=seconds {
        let _ = writeln!(
            svg,
            r#"<text x="{0:.1}" y="{1:.1}">{s}</text>"#,
            x(s * per_second),
            TOP + plot_h + 18.0
        );
    }
    let _ = writeln!(
        svg,
        r#"<text x="{0:.1}" y="{1:.1}">time since the failure (s)</text>"#,
        LEFT + plot_w / 2.0,
        HEIGHT - 14.0
    );
    let _ = writeln!(
        svg,
        r#"<text transform="translate(18 {0:.1}) rotate(-90)">retries per 100 ms</text>"#,
        TOP + plot_h / 2.0
    );
    let _ = writeln!(svg, "</g>");

    // One step line per strategy.
    for s in series {
        let mut d = format!("M{:.1},{:.1}", x(0), y(0));
        for (i, n) in s.buckets.iter().enumerate() {
            let _ = write!(d, " V{:.1} H{:.1}", y(*n), x(i + 1));
        }
        let _ = write!(d, " V{:.1}", y(0));
        let _ = writeln!(
            svg,
            r#"<path class="series" data-strategy="{}" d="{d}" fill="{1}" fill-opacity="0.12" stroke="{1}" stroke-width="1.5"/>"#,
            s.strategy.key, s.strategy.colour
        );
    }

    // Legend.
    // Between the second and the third wave of retries, where the chart is low.
    let legend_x = LEFT + plot_w * 0.42;
    let _ = writeln!(svg, r#"<g class="legend">"#);
    for (i, s) in series.iter().enumerate() {
        let row = TOP + 14.0 + 20.0 * i as f64;
        let (peak, _) = s.peak();
        let _ = writeln!(
            svg,
            r#"<rect x="{legend_x}" y="{0:.1}" width="14" height="10" fill="{1}"/><text x="{2}" y="{3:.1}">{4}: peak {peak} per 100 ms</text>"#,
            row - 9.0,
            s.strategy.colour,
            legend_x + 20.0,
            row,
            s.strategy.label,
        );
    }
    let _ = writeln!(svg, "</g>");
    svg.push_str("</svg>\n");
    svg
}

/// A step of 1, 2 or 5 times a power of ten giving at most 6 gridlines up to `max`.
fn nice_step(max: u32) -> u32 {
    let mut magnitude = 1;
    loop {
        for m in [1, 2, 5] {
            let step = m * magnitude;
            if max.div_ceil(step) <= 6 {
                return step;
            }
        }
        magnitude *= 10;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::herd::STRATEGIES;

    #[test]
    fn steps_are_round() {
        assert_eq!(nice_step(1000), 200);
        assert_eq!(nice_step(271), 50);
        assert_eq!(nice_step(5), 1);
        assert_eq!(nice_step(1), 1);
    }

    #[test]
    fn the_chart_has_one_path_per_series() {
        let series: Vec<Series> = STRATEGIES
            .iter()
            .map(|s| Series {
                strategy: s,
                buckets: vec![0, 3, 1],
            })
            .collect();
        let svg = render(&series, 4);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches(r#"class="series""#).count(), 3);
    }
}
