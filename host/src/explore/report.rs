//! `report.html`: one self-contained page (inline SVG and CSS, no script, no external address)
//! with, per group, the frontier chart, the table, the learning curves (one chart per measure,
//! every run on it) and the list of runs. Hovering a mark shows its details (SVG titles).

use std::fmt::Write as _;

use super::group::Group;
use super::plot::{self, escape, Curve};
use super::table;

const STYLE: &str = "body{font-family:'DejaVu Sans',Verdana,sans-serif;margin:16px;color:#222}\
p.note{max-width:980px}h1{font-size:20px;margin:0 0 8px}h2{font-size:18px;margin:28px 0 6px;\
border-top:1px solid #ddd;padding-top:14px}h3{font-size:15px;margin:18px 0 4px}\
table{border-collapse:collapse;margin:8px 0;font-size:13px}td,th{border:1px solid #ccc;\
padding:3px 8px;text-align:left;white-space:nowrap}th{background:#f3f3f3}td.key{font-weight:bold}\
.note{color:#555;font-size:13px}svg{display:block;max-width:100%;height:auto;margin:6px 0}\
summary{cursor:pointer;font-size:14px}";

/// The report for `groups`; `pricing` describes where the costs come from.
pub fn render(groups: &[Group], pricing: &str) -> String {
    let mut html = String::new();
    let _ = write!(
        html,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>Tessera explorer</title><style>{STYLE}</style></head><body>\n\
         <h1>Tessera explorer</h1>\n<p class=\"note\">Per group of runs (one dataset and \
         model): the frontier of wall time against quality, each numbered point a recipe's \
         mean over its seeds (bars: the seeds' range; faint dots: the seeds); the table; and \
         the learning curves of every run. Hover a mark for its details. Costs: {}.</p>\n",
        escape(pricing)
    );
    for group in groups {
        group_section(&mut html, group);
    }
    html.push_str("</body></html>\n");
    html
}

fn group_section(html: &mut String, group: &Group) {
    let runs = group.runs().count();
    let _ = write!(
        html,
        "<section id=\"group-{}\"><h2>{} <span class=\"note\">({}, {} points, {runs} runs)\
         </span></h2>\n{}\n",
        escape(&group.slug),
        escape(&group.title),
        group.metric,
        group.points.len(),
        plot::frontier_svg(group)
    );
    html.push_str("<table><thead><tr><th>#</th>");
    for h in table::headers(group) {
        let _ = write!(html, "<th>{}</th>", escape(&h));
    }
    html.push_str("</tr></thead><tbody>\n");
    for (i, row) in table::rows(group).into_iter().enumerate() {
        let _ = write!(html, "<tr><td class=\"key\">{}</td>", i + 1);
        for cell in row {
            let _ = write!(html, "<td>{}</td>", escape(&cell));
        }
        html.push_str("</tr>\n");
    }
    let _ = writeln!(
        html,
        "</tbody></table><p class=\"note\">{}. Values are mean ± half range over seeds.</p>",
        escape(&table::baseline_note(group))
    );
    html.push_str("<h3>Learning curves</h3>\n");
    for curve in [Curve::Quality, Curve::TrainingLoss] {
        match plot::curve_canvas(group, curve) {
            Some(canvas) => {
                html.push_str(&canvas.svg());
                html.push('\n');
            }
            None => {
                let _ = writeln!(
                    html,
                    "<p class=\"note\">No {} curve: no run has one (the training loss comes \
                     from the metrics.jsonl beside run.json).</p>",
                    curve.name(group)
                );
            }
        }
    }
    runs_list(html, group, runs);
    html.push_str("</section>\n");
}

/// Every run of the group, folded: its point, seed, final quality, wall time and record.
fn runs_list(html: &mut String, group: &Group, runs: usize) {
    let _ = writeln!(
        html,
        "<details><summary>The {runs} runs</summary><table><thead><tr><th>#</th><th>run</th>\
         <th>recipe</th><th>seed</th><th>{}</th><th>wall s</th><th>record</th></tr></thead>\
         <tbody>",
        group.metric
    );
    for (i, p) in group.points.iter().enumerate() {
        for (run, quality) in p.runs.iter().zip(&p.quality.values) {
            let _ = writeln!(
                html,
                "<tr><td class=\"key\">{}</td><td>{}</td><td>{}</td><td>{}</td>\
                 <td>{quality:.d$}</td><td>{:.1}</td><td>{}</td></tr>",
                i + 1,
                escape(&run.run_name),
                escape(&p.label),
                run.seed().map_or_else(|| "-".to_owned(), |s| s.to_string()),
                run.wall_seconds,
                escape(&run.source),
                d = group.metric.decimals()
            );
        }
    }
    html.push_str("</tbody></table></details>\n");
}
