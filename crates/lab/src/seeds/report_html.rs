//! An experiment's report: claims checked against measurements, tables, figures and the
//! scenarios used, written as one self-contained HTML page (SVG figures inline, no
//! external files) plus `report.json` and one CSV per table.

use serde::Serialize;
use std::fmt::Write as _;
use std::path::Path;

/// A finding of the seed, checked on our measurements.
#[derive(Debug, Clone, Serialize)]
pub struct Claim {
    /// What the seed says (or what we expect), in words.
    pub text: String,
    /// Whether our measurement agrees.
    pub holds: bool,
    /// The measured figures behind the verdict.
    pub evidence: String,
    /// Checked by the test suite (robust at every size); others are reported only.
    pub asserted: bool,
}

/// A table of figures.
#[derive(Debug, Clone, Serialize)]
pub struct Table {
    /// File stem of its CSV.
    pub name: String,
    /// Column headings.
    pub columns: Vec<String>,
    /// Rows of formatted cells.
    pub rows: Vec<Vec<String>>,
}

impl Table {
    /// An empty table.
    pub fn new(name: &str, columns: &[&str]) -> Self {
        Table { name: name.into(), columns: columns.iter().map(|c| c.to_string()).collect(), rows: Vec::new() }
    }

    fn csv(&self) -> String {
        let esc =
            |c: &str| if c.contains([',', '"']) { format!("\"{}\"", c.replace('"', "\"\"")) } else { c.to_string() };
        let mut s = self.columns.iter().map(|c| esc(c)).collect::<Vec<_>>().join(",") + "\n";
        for r in &self.rows {
            s += &(r.iter().map(|c| esc(c)).collect::<Vec<_>>().join(",") + "\n");
        }
        s
    }
}

/// A part of the report: text, and optionally a figure and a table.
#[derive(Debug, Clone, Serialize)]
pub struct Section {
    /// Heading.
    pub heading: String,
    /// Explanation (plain text, paragraphs separated by blank lines).
    pub text: String,
    /// SVG figure.
    #[serde(skip)]
    pub figure: Option<String>,
    /// Table.
    pub table: Option<Table>,
}

/// A whole experiment report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Experiment name (`scave-corun`).
    pub name: String,
    /// Title.
    pub title: String,
    /// What was run and why.
    pub intro: String,
    /// Size it ran at (quick, default, full).
    pub size: String,
    /// Claims and verdicts.
    pub claims: Vec<Claim>,
    /// Sections.
    pub sections: Vec<Section>,
    /// (label, scenario TOML) of every run.
    pub scenarios: Vec<(String, String)>,
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

impl Report {
    /// The HTML page.
    pub fn html(&self) -> String {
        let mut h = String::new();
        let _ = write!(
            h,
            "<!doctype html><html><head><meta charset=\"utf-8\"><title>{t}</title><style>\
             body{{font-family:system-ui,sans-serif;max-width:1000px;margin:2em auto;color:#222;line-height:1.45}}\
             table{{border-collapse:collapse;margin:1em 0;font-size:14px}}td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}\
             th{{background:#f3f3f3}}td:first-child,th:first-child{{text-align:left}}.ok{{color:#176f2c}}.no{{color:#b00020}}\
             pre{{background:#f7f7f7;padding:8px;overflow-x:auto;font-size:12px}}svg{{max-width:100%;height:auto}}</style></head><body>\
             <h1>{t}</h1><p><code>cachevisor experiment {n}</code> — size: {sz}</p>",
            t = esc(&self.title),
            n = esc(&self.name),
            sz = esc(&self.size)
        );
        for p in self.intro.split("\n\n") {
            let _ = write!(h, "<p>{}</p>", esc(p));
        }
        h += "<h2>Claims</h2><ul>";
        for c in &self.claims {
            let (cls, mark) = if c.holds { ("ok", "✔ holds") } else { ("no", "✘ does not hold") };
            let _ = write!(
                h,
                "<li><b class=\"{cls}\">{mark}</b>{} — {}<br><small>{}</small></li>",
                if c.asserted { " (checked in CI)" } else { "" },
                esc(&c.text),
                esc(&c.evidence)
            );
        }
        h += "</ul>";
        for s in &self.sections {
            let _ = write!(h, "<h2>{}</h2>", esc(&s.heading));
            for p in s.text.split("\n\n").filter(|p| !p.is_empty()) {
                let _ = write!(h, "<p>{}</p>", esc(p));
            }
            if let Some(f) = &s.figure {
                // The SVG document minus its XML prolog, inline.
                h += f.trim_start_matches(|c| c != '<').split_once("?>").map_or(f.as_str(), |(_, rest)| rest);
            }
            if let Some(t) = &s.table {
                h += "<table><tr>";
                for c in &t.columns {
                    let _ = write!(h, "<th>{}</th>", esc(c));
                }
                h += "</tr>";
                for r in &t.rows {
                    h += "<tr>";
                    for c in r {
                        let _ = write!(h, "<td>{}</td>", esc(c));
                    }
                    h += "</tr>";
                }
                let _ = write!(h, "</table><p><small>Also in <code>{}.csv</code>.</small></p>", esc(&t.name));
            }
        }
        h += "<h2>Scenarios</h2>";
        for (label, toml) in &self.scenarios {
            let _ = write!(h, "<details><summary>{}</summary><pre>{}</pre></details>", esc(label), esc(toml));
        }
        h += "</body></html>\n";
        h
    }

    /// Writes `report.html`, `report.json` and the tables' CSVs into `dir`.
    pub fn write(&self, dir: &Path) -> std::io::Result<()> {
        // A row with more or fewer cells than headings shifts every column after it.
        for t in self.sections.iter().filter_map(|s| s.table.as_ref()) {
            if let Some(r) = t.rows.iter().find(|r| r.len() != t.columns.len()) {
                return Err(std::io::Error::other(format!(
                    "table {}: a row of {} cells under {} headings ({r:?})",
                    t.name,
                    r.len(),
                    t.columns.len()
                )));
            }
        }
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("report.html"), self.html())?;
        std::fs::write(dir.join("report.json"), serde_json::to_string_pretty(self).map_err(std::io::Error::other)?)?;
        for t in self.sections.iter().filter_map(|s| s.table.as_ref()) {
            std::fs::write(dir.join(format!("{}.csv", t.name)), t.csv())?;
        }
        Ok(())
    }
}
