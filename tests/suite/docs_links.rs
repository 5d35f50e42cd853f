//! The documentation holds together, checked without a cluster:
//!
//! * every relative link in the Markdown files (README.md, BENCHMARKS.md and
//!   any other at the top of the repository, and docs/*.md) leads to a file
//!   or folder that exists, and its `#anchor`, if any, names a heading of
//!   the Markdown file it leads to, as GitHub makes anchors of headings;
//! * README.md stays short and links to every page of `docs/`.

use std::path::Path;

/// The README's length at most, in lines: what Copyrator is, the two
/// commands, install, a first rule and links; the rest lives in `docs/`.
const README_MAX_LINES: usize = 250;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The Markdown files checked, relative to the repository, sorted: every
/// `*.md` at its top and in `docs/`.
fn markdown_files() -> Vec<String> {
    let mut files = Vec::new();
    for dir in ["", "docs"] {
        let entries = std::fs::read_dir(root().join(dir))
            .unwrap_or_else(|e| panic!("reading {}/: {e}", root().join(dir).display()));
        for entry in entries {
            let name = entry.expect("a directory entry").file_name();
            let name = name.to_str().expect("a UTF-8 file name");
            if name.ends_with(".md") {
                files.push(if dir.is_empty() {
                    name.to_owned()
                } else {
                    format!("{dir}/{name}")
                });
            }
        }
    }
    files.sort();
    files
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

/// The page with every line of a fenced code block blanked, so that line
/// numbers stay those of the file.
fn prose(page: &str) -> String {
    let mut out = String::with_capacity(page.len());
    let mut in_block = false;
    for line in page.lines() {
        let fence = line.trim_start().starts_with("```");
        if !fence && !in_block {
            out.push_str(line);
        }
        if fence {
            in_block = !in_block;
        }
        out.push('\n');
    }
    out
}

/// GitHub's anchor for a heading's text: lowercase; letters, digits, `-`
/// and `_` kept, a space made `-`, everything else (punctuation, the
/// backticks of code, a link's brackets) dropped; a link counts by its text.
fn slug(heading: &str) -> String {
    let mut text = String::new();
    let mut rest = heading;
    // A link's target is no part of the heading's text.
    while let Some(at) = rest.find("](") {
        text.push_str(&rest[..at]);
        rest = rest[at..].split_once(')').map_or("", |(_, after)| after);
    }
    text.push_str(rest);
    text.trim()
        .chars()
        .flat_map(char::to_lowercase)
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a page's headings (`#` to `######`, outside code blocks),
/// a repeated one numbered as GitHub numbers it (`-1`, `-2`, …).
fn anchors(page: &str) -> Vec<String> {
    let mut anchors: Vec<String> = Vec::new();
    for line in prose(page).lines() {
        let hashes = line.len() - line.trim_start_matches('#').len();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        // A closing sequence of `#`s is no part of the text.
        let text = line[hashes..].trim().trim_end_matches('#');
        let base = slug(text);
        let mut anchor = base.clone();
        let mut n = 0;
        while anchors.contains(&anchor) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
        anchors.push(anchor);
    }
    anchors
}

/// Every link of a page outside code: its line and its target (`](target)`,
/// an optional title after the target left out).
fn links(page: &str) -> Vec<(usize, String)> {
    let prose = prose(page);
    let mut links = Vec::new();
    let mut offset = 0;
    // Inline code: every other piece between backticks.
    for (i, piece) in prose.split('`').enumerate() {
        if i % 2 == 0 {
            for (at, _) in piece.match_indices("](") {
                let rest = &piece[at + 2..];
                let end = rest
                    .find(|c: char| c == ')' || c.is_whitespace())
                    .unwrap_or(rest.len());
                let target = rest[..end].trim_start_matches('<').trim_end_matches('>');
                let line = 1 + prose[..offset + at].matches('\n').count();
                links.push((line, target.to_owned()));
            }
        }
        offset += piece.len() + 1;
    }
    links
}

/// What is wrong with the link `target` of the page `path`, if anything.
fn check_link(path: &str, target: &str) -> Option<String> {
    if target.contains("://") || target.starts_with("mailto:") {
        return None;
    }
    let (file, anchor) = target.split_once('#').unwrap_or((target, ""));
    let resolved = if file.is_empty() {
        path.to_owned()
    } else {
        let dir = Path::new(path).parent().unwrap_or(Path::new(""));
        // `..` resolved by hand, so that the path read is the one named.
        let mut parts: Vec<&str> = dir
            .to_str()
            .expect("a UTF-8 path")
            .split('/')
            .filter(|p| !p.is_empty())
            .collect();
        for part in file.split('/') {
            match part {
                "" | "." => {}
                ".." => {
                    if parts.pop().is_none() {
                        return Some(format!("{file} leads out of the repository"));
                    }
                }
                part => parts.push(part),
            }
        }
        parts.join("/")
    };
    if !root().join(&resolved).exists() {
        return Some(format!("{resolved} does not exist"));
    }
    if anchor.is_empty() {
        return None;
    }
    if !resolved.ends_with(".md") {
        return Some(format!(
            "{resolved} is no Markdown file, so it has no heading #{anchor}"
        ));
    }
    let known = anchors(&read(&resolved));
    if known.iter().any(|a| a == anchor) {
        return None;
    }
    Some(format!(
        "{resolved} has no heading whose anchor is #{anchor}; its anchors: {}",
        known.join(", ")
    ))
}

/// Every relative link of the documentation leads somewhere: to a file or
/// folder of the repository and, with an anchor, to a heading of that
/// Markdown file.
#[test]
fn every_relative_link_leads_to_a_file_and_heading() {
    let files = markdown_files();
    assert!(
        files.iter().any(|f| f == "README.md") && files.iter().any(|f| f.starts_with("docs/")),
        "README.md and docs/*.md are checked: {files:?}"
    );
    let mut problems = Vec::new();
    let mut checked = 0;
    for path in &files {
        for (line, target) in links(&read(path)) {
            checked += 1;
            if let Some(problem) = check_link(path, &target) {
                problems.push(format!("{path}:{line}: a dead link ({target}): {problem}"));
            }
        }
    }
    assert!(checked > 0, "no link found in {files:?}");
    assert!(
        problems.is_empty(),
        "{} of {checked} links are dead:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// The README stays an entry: short, and linking to every page of `docs/`.
#[test]
fn the_readme_is_short_and_links_every_page() {
    let readme = read("README.md");
    let lines = readme.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines, more than {README_MAX_LINES}: move the details into docs/"
    );
    let linked: Vec<String> = links(&readme)
        .into_iter()
        .map(|(_, target)| target.split('#').next().unwrap_or_default().to_owned())
        .collect();
    let unlinked: Vec<String> = markdown_files()
        .into_iter()
        .filter(|f| f.starts_with("docs/") && !linked.contains(f))
        .collect();
    assert!(
        unlinked.is_empty(),
        "README.md links no page {unlinked:?}: add each to its list of documentation"
    );
}

/// The anchors GitHub gives headings, as `slug` computes them.
#[test]
fn anchors_are_made_as_github_makes_them() {
    for (heading, anchor) in [
        ("What happens when", "what-happens-when"),
        ("Trust and security", "trust-and-security"),
        (
            "`copyrator plan`: before applying",
            "copyrator-plan-before-applying",
        ),
        ("Deadlines & retries", "deadlines--retries"),
        ("The `--kinds` flag", "the---kinds-flag"),
        ("snake_case and v1.2", "snake_case-and-v12"),
        ("A [link](other.md#x) in it", "a-link-in-it"),
    ] {
        assert_eq!(slug(heading), anchor, "the anchor of {heading:?}");
    }
    let page = "# Title\n\n## Limits\n\n```sh\n# not a heading\n```\n\n## Limits\n#hashtag\n";
    assert_eq!(anchors(page), ["title", "limits", "limits-1"]);
    let page = "See [a](a.md) and `[b](b.md)`,\n[c](c.md#x \"title\").\n```\n[d](d.md)\n```\n";
    assert_eq!(
        links(page),
        [(1, "a.md".to_owned()), (2, "c.md#x".to_owned())]
    );
}
