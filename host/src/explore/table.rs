//! The table of a group's points, as cells that the terminal and the HTML report both render.

use super::group::Group;
use super::point::{Point, TimeToBaseline};

/// Column headers of [`rows`].
pub fn headers(group: &Group) -> Vec<String> {
    [
        "recipe",
        "seeds",
        &group.metric.name(),
        "wall s",
        "cost $",
        "time to baseline quality s",
        "speed-up",
        "frontier",
    ]
    .iter()
    .map(|h| (*h).to_owned())
    .collect()
}

/// One row of cells per point, in the group's order.
pub fn rows(group: &Group) -> Vec<Vec<String>> {
    group.points.iter().map(|p| row(group, p)).collect()
}

fn row(group: &Group, p: &Point) -> Vec<String> {
    let cost = p
        .cost_usd
        .as_ref()
        .map_or_else(|| "-".to_owned(), |c| c.describe(4));
    let (time, speedup) = time_and_speedup(&p.time_to_baseline);
    vec![
        p.label.clone(),
        p.runs.len().to_string(),
        p.quality.describe(group.metric.decimals()),
        p.wall_seconds.describe(1),
        cost,
        time,
        speedup,
        frontier_cell(p).to_owned(),
    ]
}

/// The "time to baseline quality s" and "speed-up" cells.
pub fn time_and_speedup(t: &TimeToBaseline) -> (String, String) {
    match t {
        TimeToBaseline::NoBaseline => ("no baseline".to_owned(), "-".to_owned()),
        TimeToBaseline::NotReached => ("not reached".to_owned(), "-".to_owned()),
        TimeToBaseline::NoEvalTimes => ("no eval times".to_owned(), "-".to_owned()),
        t => (
            t.seconds().map_or_else(String::new, |s| format!("{s:.1}")),
            t.speedup().map_or_else(String::new, |s| format!("{s:.2}x")),
        ),
    }
}

/// The "frontier" cell: which frontiers the point is on.
pub fn frontier_cell(p: &Point) -> &'static str {
    match (p.on_time_frontier, p.on_cost_frontier) {
        (true, true) => "yes (time, cost)",
        (true, false) => "yes (time)",
        (false, true) => "yes (cost)",
        (false, false) => "no",
    }
}

/// The group's table as aligned text, with a title line and a note on the baseline.
pub fn render_text(group: &Group) -> String {
    let headers = headers(group);
    let rows = rows(group);
    let widths: Vec<usize> = (0..headers.len())
        .map(|c| {
            rows.iter()
                .map(|r| r[c].chars().count())
                .chain([headers[c].chars().count()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: &[String]| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        padded.join("  ").trim_end().to_owned()
    };
    let mut out = format!("{} ({})\n", group.title, group.metric);
    out.push_str(&line(&headers));
    out.push('\n');
    for r in &rows {
        out.push_str(&line(r));
        out.push('\n');
    }
    out.push_str(&baseline_note(group));
    out.push('\n');
    out
}

/// What the speed-ups are measured against.
pub fn baseline_note(group: &Group) -> String {
    match group.baseline_point() {
        Some(b) => format!(
            "baseline: final {} {:.d$} after {:.1} s; speed-up = baseline wall time / time to \
             reach that {}",
            group.metric,
            b.quality.mean(),
            b.wall_seconds.mean(),
            group.metric,
            d = group.metric.decimals()
        ),
        None => "no baseline run (recipe \"baseline\") in this group: no speed-ups".to_owned(),
    }
}
