//! `report.html`: one self-contained page (inline SVG and CSS, no script, no external address)
//! with, per group, the frontier plot, the table and each run's learning curves.

use std::fmt::Write as _;

use super::group::Group;
use super::plot::{self, escape};
use super::table;

const STYLE: &str = "body{font-family:sans-serif;margin:16px;color:#222}\
h1{font-size:20px;margin:0 0 8px}h2{font-size:18px;margin:24px 0 8px}h3{font-size:15px;margin:16px 0 4px}\
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}\
th{background:#f3f3f3}.note{color:#555;font-size:13px}svg{display:block}";

/// The report for `groups`; `pricing` describes where the costs come from.
pub fn render(groups: &[Group], pricing: &str, text: bool) -> Result<String, String> {
    let mut html = String::new();
    let _ = write!(
        html,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>Tessera explorer</title><style>{STYLE}</style></head><body>\n\
         <h1>Tessera explorer</h1><p class=\"note\">Costs: {}</p>\n",
        escape(pricing)
    );
    for group in groups {
        group_section(&mut html, group, text)?;
    }
    html.push_str("</body></html>\n");
    Ok(html)
}

fn group_section(html: &mut String, group: &Group, text: bool) -> Result<(), String> {
    let _ = write!(
        html,
        "<section id=\"group-{}\"><h2>{}</h2>\n{}\n",
        escape(&group.slug),
        escape(&group.title),
        plot::frontier_svg(group, text)?
    );
    html.push_str("<table><thead><tr>");
    for h in table::headers(group) {
        let _ = write!(html, "<th>{}</th>", escape(&h));
    }
    html.push_str("</tr></thead><tbody>\n");
    for row in table::rows(group) {
        html.push_str("<tr>");
        for cell in row {
            let _ = write!(html, "<td>{}</td>", escape(&cell));
        }
        html.push_str("</tr>\n");
    }
    let _ = writeln!(
        html,
        "</tbody></table><p class=\"note\">{}</p>",
        escape(&table::baseline_note(group))
    );
    for run in group.runs() {
        let colour = plot::recipe_colour(group, &run.recipe);
        let _ = write!(
            html,
            "<h3>{} <span class=\"note\">({}, {})</span></h3>\n{}\n",
            escape(&run.run_name),
            escape(&run.recipe),
            escape(&run.source),
            plot::curves_svg(run, group.metric, colour, text)?
        );
    }
    html.push_str("</section>\n");
    Ok(())
}
