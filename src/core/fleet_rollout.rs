//! One rollout per source across every cluster a staged rule targets: the
//! stage each content has reached, moved on from what each cluster's last
//! pass found ([`SiteFacts`]). Pure: the clock, each cluster's facts and
//! reachability, and the approvals come in; where each rollout stands
//! comes out, for the rule's status. The controller writes that status
//! before any cluster acts on it (the rule's `resourceVersion` as a
//! precondition), so that a replica taking the Lease reads where every
//! rollout stood, and goes on from there: the same stage, the same pause.
//!
//! A stage settles when, in each of its clusters, its places hold the new
//! content by their marks and (with `restartConsumers`) their consumers
//! run it; a member that cannot be reached counts as not settled, unless
//! the stage lets that many be missing (`maxUnavailableClusters`). The
//! next stage opens a pause after it settled, and, where it asks for one,
//! once approved for this content.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::api::rule::{RolloutCluster, RolloutStatus};
use crate::core::resolve::{ClusterOf, Stages};
use crate::core::rollout::{HALTED_RECHECK, Open, Phase, Progress, SETTLE_RECHECK, SiteFacts};

/// Where one source's new content stands across the clusters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Track {
    pub(crate) source: String,
    /// The new content's digest.
    pub(crate) content: String,
    /// The last stage reached.
    pub(crate) stage: usize,
    /// Whether that stage is open (else it awaits an approval).
    pub(crate) opened: bool,
    pub(crate) opened_at: DateTime<Utc>,
    pub(crate) settled_at: Option<DateTime<Utc>>,
    pub(crate) phase: Phase,
    pub(crate) clusters: Vec<(String, &'static str)>,
}

impl Track {
    /// How far its content may be written.
    pub(crate) fn open(&self) -> Open {
        Open {
            through: if self.opened {
                Some(self.stage)
            } else {
                self.stage.checked_sub(1)
            },
        }
    }
}

/// A rule's rollouts under way, by copy name.
pub(crate) type Tracks = BTreeMap<String, Track>;

/// One cluster as the rollouts see it.
pub(crate) struct SiteView<'a> {
    pub(crate) name: &'a str,
    pub(crate) cluster: ClusterOf<'a>,
    pub(crate) reachable: bool,
    /// What its last pass found (`None`: no pass there yet).
    pub(crate) facts: Option<&'a SiteFacts>,
    /// What its last pass recorded as rolled out, as the status keeps it:
    /// by copy name, the newest digest (the content it planned) last.
    pub(crate) planned: Option<&'a BTreeMap<String, String>>,
}

impl SiteView<'_> {
    /// The content its last pass planned for the copies named `name`.
    fn current(&self, name: &str) -> Option<&str> {
        self.planned?.get(name)?.split_whitespace().last()
    }
}

/// What a step needs.
pub(crate) struct Step<'a> {
    pub(crate) stages: &'a Stages,
    pub(crate) sites: &'a [SiteView<'a>],
    pub(crate) now: DateTime<Utc>,
    /// The new content of a copy name now (its source's, at home).
    pub(crate) current: &'a dyn Fn(&str) -> Option<(String, String)>,
    /// Whether the rule's annotation approves a stage (by name) for a content.
    pub(crate) approved: &'a dyn Fn(&str, &str) -> bool,
    pub(crate) consumers: bool,
}

/// What a step came to.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Advanced {
    pub(crate) tracks: Tracks,
    /// When to look again (a pause ends, a settle timeout passes).
    pub(crate) recheck_in: Option<Duration>,
}

impl Advanced {
    fn recheck_no_later_than(&mut self, wait: Duration) {
        self.recheck_in = Some(self.recheck_in.map_or(wait, |r| r.min(wait)));
    }
}

/// Move each rollout of `before` on as far as the clusters' facts allow,
/// and start one for each content held past the first stage somewhere.
pub(crate) fn advance(before: &Tracks, step: &Step<'_>) -> Advanced {
    let mut names: BTreeSet<&str> = before.keys().map(String::as_str).collect();
    for site in step.sites {
        for (name, facts) in site.facts.into_iter().flatten() {
            if facts.held_later {
                names.insert(name);
            }
        }
    }
    let mut advanced = Advanced::default();
    for name in names {
        let Some((source, content)) = (step.current)(name) else {
            continue;
        };
        let held = step.sites.iter().any(|site| {
            site.facts
                .and_then(|f| f.get(name))
                .is_some_and(|f| f.content == content && f.held_later)
        });
        let mut track = match before.get(name).filter(|t| t.content == content) {
            Some(track) => track.clone(),
            None if held => start(name, &content, &source, step),
            None => continue,
        };
        // A record that lags what the copies' marks show (the stage after
        // it written already) goes on from the marks: what is written
        // there is never written back.
        if let Some(done) = done_through(name, &content, step)
            && done > track.stage
        {
            track.stage = done;
            track.opened = true;
            track.opened_at = step.now;
            track.settled_at = None;
        }
        track.source = source;
        move_on(name, &mut track, step, &mut advanced);
        track.clusters = clusters_of(name, &track, step);
        if track.stage + 1 >= step.stages.count() && track.opened && done(name, &content, step) {
            continue;
        }
        advanced.tracks.insert(name.to_owned(), track);
    }
    advanced
}

/// A rollout of `content` starts: at the first stage, or, where the
/// copies' marks show stages done already (all their copies hold it), at
/// the last of those (a record lost or lagging: only its pause runs again).
fn start(name: &str, content: &str, source: &str, step: &Step<'_>) -> Track {
    let stage = done_through(name, content, step).unwrap_or(0);
    Track {
        source: source.to_owned(),
        content: content.to_owned(),
        stage,
        opened: stage > 0 || !step.stages.manual(0),
        opened_at: step.now,
        settled_at: None,
        phase: Phase::Settling,
        clusters: Vec::new(),
    }
}

/// The last stage done by the marks, every stage before it done or
/// without copies: a stage is done where it holds copies and none owes
/// the content, in every cluster that passed at this content.
pub(crate) fn done_through(name: &str, content: &str, step: &Step<'_>) -> Option<usize> {
    let mut last = None;
    for stage in 0..step.stages.count() {
        let mut present = false;
        for site in step.sites {
            let Some(facts) = site.facts.and_then(|f| f.get(name)) else {
                continue;
            };
            if facts.content != content {
                continue;
            }
            if facts.owed.contains(&stage) {
                return last;
            }
            present |= facts.present.contains(&stage);
        }
        if present {
            last = Some(stage);
        }
    }
    last
}

/// Whether every cluster passed at `content` and owes it nothing.
fn done(name: &str, content: &str, step: &Step<'_>) -> bool {
    step.sites.iter().all(|site| {
        site.reachable
            && site.current(name).is_none_or(|c| c == content)
            && site
                .facts
                .and_then(|f| f.get(name))
                .is_none_or(|f| f.content != content || f.owed.is_empty())
    })
}

/// Open as many stages as have settled, paused and been approved; say
/// where it stands.
fn move_on(name: &str, track: &mut Track, step: &Step<'_>, advanced: &mut Advanced) {
    let stages = step.stages;
    let now = step.now;
    loop {
        let stage = track.stage;
        if !track.opened {
            if (step.approved)(stages.name(stage), &track.content) {
                track.opened = true;
                track.opened_at = now;
                continue;
            }
            track.phase = Phase::AwaitingApproval;
            return;
        }
        if stage + 1 >= stages.count() {
            // The last stage is open: nothing is held any more.
            advanced.recheck_no_later_than(SETTLE_RECHECK);
            track.phase = Phase::Settling;
            return;
        }
        match not_settled(name, track, step) {
            None => {
                let settled = *track.settled_at.get_or_insert(now);
                let opens_at = settled + stages.pause(stage);
                if now < opens_at {
                    advanced.recheck_no_later_than((opens_at - now).to_std().unwrap_or_default());
                    track.phase = Phase::Pausing;
                    return;
                }
                track.stage += 1;
                track.opened = !stages.manual(track.stage);
                track.opened_at = now;
                track.settled_at = None;
            }
            Some(why) => {
                track.settled_at = None;
                let halts_at = track.opened_at + stages.settle_timeout;
                if now >= halts_at {
                    advanced.recheck_no_later_than(HALTED_RECHECK);
                    track.phase = Phase::Halted(why);
                } else {
                    advanced.recheck_no_later_than(SETTLE_RECHECK);
                    track.phase = Phase::Settling;
                }
                return;
            }
        }
    }
}

/// Why the open stage of `track` has not settled, across its clusters:
/// `None` when it has.
fn not_settled(name: &str, track: &Track, step: &Step<'_>) -> Option<Vec<String>> {
    let stage = track.stage;
    let stage_name = step.stages.name(stage);
    let mut why = Vec::new();
    let mut unreachable = Vec::new();
    for site in step.sites {
        if !step.stages.covers(stage, site.cluster) {
            continue;
        }
        if !site.reachable {
            unreachable.push(site.name);
            continue;
        }
        // Said of a member with its name; of the home cluster as before
        // there were members.
        let there = match site.cluster {
            ClusterOf::Home => String::new(),
            ClusterOf::Member(name, _) => format!(" in cluster {name}"),
        };
        if site.current(name).is_some_and(|c| c != track.content) {
            why.push(format!("the new content not planned{there} yet"));
            continue;
        }
        let facts = site
            .facts
            .and_then(|f| f.get(name))
            .filter(|f| f.content == track.content);
        let Some(facts) = facts else { continue };
        if facts.owed.contains(&stage) {
            why.push(format!(
                "copies in stage {stage_name}{there} not written yet"
            ));
        } else if step.consumers && facts.present.contains(&stage) {
            match facts.waiting.get(&stage) {
                None => why.push(format!("consumers{there} not looked at yet")),
                Some(waiting) => why.extend(waiting.iter().map(|w| format!("{w}{there}"))),
            }
        }
    }
    if unreachable.len() > step.stages.max_unavailable(stage) {
        why.extend(
            unreachable
                .iter()
                .map(|name| format!("cluster {name} unreachable")),
        );
    }
    (!why.is_empty()).then_some(why)
}

/// Each cluster's phase in `track`, at most [`MAX_CLUSTERS_LISTED`].
fn clusters_of(name: &str, track: &Track, step: &Step<'_>) -> Vec<(String, &'static str)> {
    let through = track.open().through;
    step.sites
        .iter()
        .take(MAX_CLUSTERS_LISTED)
        .map(|site| {
            let facts = site
                .facts
                .and_then(|f| f.get(name))
                .filter(|f| f.content == track.content);
            let phase = if !site.reachable {
                "Unreachable"
            } else if let Some(facts) = facts {
                let owed_open = facts.owed.iter().any(|s| through.is_some_and(|t| *s <= t));
                if owed_open {
                    "Settling"
                } else if !facts.owed.is_empty() {
                    "Waiting"
                } else {
                    "Done"
                }
            } else {
                "Done"
            };
            (site.name.to_owned(), phase)
        })
        .collect()
}

/// Clusters listed in one rollout's status, at most.
pub(crate) const MAX_CLUSTERS_LISTED: usize = 50;

/// `tracks` as the status says them.
pub(crate) fn progress(tracks: &Tracks, stages: &Stages) -> Vec<Progress> {
    tracks
        .iter()
        .map(|(name, t)| Progress {
            source: t.source.clone(),
            name: name.clone(),
            content: t.content.clone(),
            stage: t.stage,
            stage_name: stages.name(t.stage).to_owned(),
            stages: stages.count(),
            phase: t.phase.clone(),
            opened_at: timestamp(t.opened_at),
            settled_at: t.settled_at.map(timestamp),
            clusters: t.clusters.clone(),
        })
        .collect()
}

fn timestamp(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// The rollouts a rule's status recorded: where each stood. An entry
/// that does not say enough (written before this record) is left out: its
/// rollout is built again from the copies' marks.
pub(crate) fn from_status(recorded: &[RolloutStatus], stages: &Stages) -> Tracks {
    recorded
        .iter()
        .filter_map(|r| {
            let name = r.name.clone()?;
            let content = r.content.clone()?;
            let opened_at = DateTime::parse_from_rfc3339(r.opened_at.as_deref()?)
                .ok()?
                .with_timezone(&Utc);
            let settled_at = match r.settled_at.as_deref() {
                Some(at) => Some(DateTime::parse_from_rfc3339(at).ok()?.with_timezone(&Utc)),
                None => None,
            };
            let stage = (r.stage_number as usize).checked_sub(1)?;
            // The stages may have changed since: a stage of another name
            // is no stage of this rollout's any more.
            if stage >= stages.count() || stages.name(stage) != r.stage {
                return None;
            }
            let phase = match r.phase.as_str() {
                "Pausing" => Phase::Pausing,
                "AwaitingApproval" => Phase::AwaitingApproval,
                "Halted" => Phase::Halted(r.message.iter().cloned().collect()),
                _ => Phase::Settling,
            };
            Some((
                name,
                Track {
                    source: r.source.clone(),
                    content,
                    stage,
                    opened: phase != Phase::AwaitingApproval,
                    opened_at,
                    settled_at,
                    phase,
                    clusters: Vec::new(),
                },
            ))
        })
        .collect()
}

/// One rollout as the status says it.
pub(crate) fn rollout_cluster(name: &str, phase: &str) -> RolloutCluster {
    RolloutCluster {
        name: name.to_owned(),
        phase: phase.to_owned(),
    }
}

/// The approvals of the rule's annotation `copyrator.flant.com/approve`:
/// `STAGE=CONTENT` entries, separated by white space or commas.
pub(crate) fn approvals(annotation: Option<&str>) -> BTreeSet<(String, String)> {
    annotation
        .unwrap_or_default()
        .split(|c: char| c.is_whitespace() || c == ',')
        .filter_map(|entry| {
            let (stage, content) = entry.split_once('=')?;
            Some((stage.to_owned(), content.to_owned()))
        })
        .collect()
}

/// The annotation on a rule that approves stages for contents.
pub(crate) const APPROVE_ANNOTATION: &str = "copyrator.flant.com/approve";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::selector::{Glob, LabelSelector};
    use crate::core::resolve::{ClusterTargets, Stage, TargetSelector};
    use crate::core::rollout::SourceFacts;

    const PAUSE: Duration = Duration::from_secs(60);
    const TIMEOUT: Duration = Duration::from_secs(300);
    const NEW: &str = "00000000000000aa";

    fn at(seconds: i64) -> DateTime<Utc> {
        DateTime::UNIX_EPOCH + chrono::Duration::seconds(seconds)
    }

    /// `staging` (member a, a pause of a minute), `eu` (members labelled
    /// region=eu; `manual`: approved by hand), then the rest.
    fn fleet_stages(manual: bool, max_unavailable: usize) -> Stages {
        let everywhere = TargetSelector {
            namespace_selector: None,
            include: vec![Glob::new("*").expect("a glob")],
            exclude: Vec::new(),
        };
        let eu: k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector =
            serde_json::from_value(serde_json::json!({"matchLabels": {"region": "eu"}}))
                .expect("a selector");
        Stages {
            stages: vec![
                Stage {
                    name: "staging".into(),
                    selector: everywhere.clone(),
                    pause: PAUSE,
                    clusters: Some(ClusterTargets {
                        names: ["a".to_owned()].into(),
                        selector: None,
                        local: false,
                    }),
                    manual: false,
                    max_unavailable,
                },
                Stage {
                    name: "eu".into(),
                    selector: everywhere,
                    pause: Duration::ZERO,
                    clusters: Some(ClusterTargets {
                        names: Default::default(),
                        selector: Some(LabelSelector::from_k8s(&eu).expect("valid")),
                        local: false,
                    }),
                    manual,
                    max_unavailable: 0,
                },
            ],
            settle_timeout: TIMEOUT,
        }
    }

    /// One source's facts: stages owed, stages with a copy.
    fn facts(owed: &[usize], present: &[usize]) -> SiteFacts {
        SiteFacts::from([(
            "cm".to_owned(),
            SourceFacts {
                source: "src/cm".into(),
                content: NEW.into(),
                owed: owed.iter().copied().collect(),
                present: present.iter().copied().collect(),
                held_later: owed.iter().any(|s| *s > 0),
                waiting: BTreeMap::new(),
            },
        )])
    }

    /// The fleet: home (the rest), member a (staging), member b (eu),
    /// each with its facts and whether it answers.
    struct Fleet {
        home: SiteFacts,
        a: SiteFacts,
        b: SiteFacts,
        a_reachable: bool,
    }

    impl Fleet {
        /// The change made: a owes staging, b owes eu, home owes the rest.
        fn changed() -> Self {
            Self {
                home: facts(&[2], &[2]),
                a: facts(&[0], &[0]),
                b: facts(&[1], &[1]),
                a_reachable: true,
            }
        }

        fn step(
            &self,
            stages: &Stages,
            before: &Tracks,
            now: i64,
            approved: &[(&str, &str)],
        ) -> Advanced {
            let eu = BTreeMap::from([("region".to_owned(), "eu".to_owned())]);
            let none = BTreeMap::new();
            let planned = BTreeMap::from([("cm".to_owned(), NEW.to_owned())]);
            let sites = [
                SiteView {
                    name: "home",
                    cluster: ClusterOf::Home,
                    reachable: true,
                    facts: Some(&self.home),
                    planned: Some(&planned),
                },
                SiteView {
                    name: "a",
                    cluster: ClusterOf::Member("a", &none),
                    reachable: self.a_reachable,
                    facts: Some(&self.a),
                    planned: Some(&planned),
                },
                SiteView {
                    name: "b",
                    cluster: ClusterOf::Member("b", &eu),
                    reachable: true,
                    facts: Some(&self.b),
                    planned: Some(&planned),
                },
            ];
            let approvals: BTreeSet<(String, String)> = approved
                .iter()
                .map(|(s, c)| ((*s).to_owned(), (*c).to_owned()))
                .collect();
            let approved = |stage: &str, content: &str| {
                approvals.contains(&(stage.to_owned(), content.to_owned()))
            };
            let current = |_: &str| Some(("src/cm".to_owned(), NEW.to_owned()));
            advance(
                before,
                &Step {
                    stages,
                    sites: &sites,
                    now: at(now),
                    current: &current,
                    approved: &approved,
                    consumers: false,
                },
            )
        }
    }

    fn through(advanced: &Advanced) -> Option<usize> {
        advanced.tracks["cm"].open().through
    }

    #[test]
    fn a_stage_of_other_clusters_opens_only_after_the_one_before_settled_and_paused() {
        let stages = fleet_stages(false, 0);
        let mut fleet = Fleet::changed();
        let started = fleet.step(&stages, &Tracks::new(), 0, &[]);
        assert_eq!(through(&started), Some(0), "staging opens");
        assert_eq!(started.tracks["cm"].phase, Phase::Settling);
        let clusters: Vec<(&str, &str)> = started.tracks["cm"]
            .clusters
            .iter()
            .map(|(n, p)| (n.as_str(), *p))
            .collect();
        assert_eq!(
            clusters,
            [("home", "Waiting"), ("a", "Settling"), ("b", "Waiting")]
        );
        // a written: staging settles and pauses a minute.
        fleet.a = facts(&[], &[0]);
        let pausing = fleet.step(&stages, &started.tracks, 10, &[]);
        assert_eq!(pausing.tracks["cm"].phase, Phase::Pausing);
        assert_eq!(through(&pausing), Some(0));
        assert_eq!(pausing.recheck_in, Some(PAUSE));
        let still = fleet.step(&stages, &pausing.tracks, 40, &[]);
        assert_eq!(through(&still), Some(0), "still pausing");
        let eu = fleet.step(&stages, &still.tracks, 70, &[]);
        assert_eq!(through(&eu), Some(1), "eu opens after the pause");
        // b written: eu settles (no pause), the rest opens; home written: done.
        fleet.b = facts(&[], &[1]);
        let rest = fleet.step(&stages, &eu.tracks, 71, &[]);
        assert_eq!(through(&rest), Some(2));
        fleet.home = facts(&[], &[2]);
        let done = fleet.step(&stages, &rest.tracks, 72, &[]);
        assert!(done.tracks.is_empty(), "rolled out everywhere");
    }

    #[test]
    fn a_resumed_rollout_keeps_its_stage_and_its_pause_deadline() {
        let stages = fleet_stages(false, 0);
        let mut fleet = Fleet::changed();
        let started = fleet.step(&stages, &Tracks::new(), 0, &[]);
        fleet.a = facts(&[], &[0]);
        let pausing = fleet.step(&stages, &started.tracks, 10, &[]);
        // What the status says is all a new leader knows.
        let recorded: Vec<RolloutStatus> = progress(&pausing.tracks, &stages)
            .iter()
            .map(|p| {
                let mut status = RolloutStatus {
                    source: p.source.clone(),
                    stage: p.stage_name.clone(),
                    stage_number: p.stage as u32 + 1,
                    stages: p.stages as u32,
                    phase: p.phase.word().to_owned(),
                    ..RolloutStatus::default()
                };
                status.name = Some(p.name.clone());
                status.content = Some(p.content.clone());
                status.opened_at = Some(p.opened_at.clone());
                status.settled_at = p.settled_at.clone();
                status
            })
            .collect();
        let resumed = from_status(&recorded, &stages);
        assert_eq!(resumed["cm"].stage, 0);
        assert_eq!(resumed["cm"].settled_at, Some(at(10)));
        let later = fleet.step(&stages, &resumed, 40, &[]);
        assert_eq!(later.tracks["cm"].phase, Phase::Pausing);
        assert_eq!(
            later.recheck_in,
            Some(Duration::from_secs(30)),
            "the same deadline"
        );
        assert_eq!(through(&fleet.step(&stages, &resumed, 70, &[])), Some(1));
    }

    #[test]
    fn with_no_record_the_marks_say_where_it_stands_and_only_a_pause_runs_again() {
        let stages = fleet_stages(false, 0);
        let mut fleet = Fleet::changed();
        // staging and eu hold the new content already; the rest does not.
        fleet.a = facts(&[], &[0]);
        fleet.b = facts(&[], &[1]);
        let rebuilt = fleet.step(&stages, &Tracks::new(), 100, &[]);
        assert_eq!(through(&rebuilt), Some(2), "eu is done, and has no pause");
        // Only staging done: it pauses again, as a whole minute.
        let mut fleet = Fleet::changed();
        fleet.a = facts(&[], &[0]);
        let rebuilt = fleet.step(&stages, &Tracks::new(), 100, &[]);
        assert_eq!(rebuilt.tracks["cm"].phase, Phase::Pausing);
        assert_eq!(through(&rebuilt), Some(0));
        assert_eq!(rebuilt.recheck_in, Some(PAUSE));
        // A record that lags (staging) goes on from the marks too.
        let mut lagging = Fleet::changed();
        lagging.a = facts(&[], &[0]);
        lagging.b = facts(&[], &[1]);
        let started = Fleet::changed().step(&stages, &Tracks::new(), 0, &[]);
        let on = lagging.step(&stages, &started.tracks, 100, &[]);
        assert_eq!(through(&on), Some(2));
    }

    #[test]
    fn a_manual_stage_opens_only_for_its_own_approval_of_this_content() {
        let stages = fleet_stages(true, 0);
        let mut fleet = Fleet::changed();
        let started = fleet.step(&stages, &Tracks::new(), 0, &[]);
        fleet.a = facts(&[], &[0]);
        let pausing = fleet.step(&stages, &started.tracks, 100, &[]);
        let waiting = fleet.step(&stages, &pausing.tracks, 200, &[]);
        assert_eq!(waiting.tracks["cm"].phase, Phase::AwaitingApproval);
        assert_eq!(through(&waiting), Some(0), "eu is not open");
        let other_content =
            fleet.step(&stages, &waiting.tracks, 201, &[("eu", "00000000000000bb")]);
        assert_eq!(through(&other_content), Some(0));
        let other_stage = fleet.step(&stages, &waiting.tracks, 201, &[("staging", NEW)]);
        assert_eq!(through(&other_stage), Some(0));
        let approved = fleet.step(&stages, &waiting.tracks, 202, &[("eu", NEW)]);
        assert_eq!(through(&approved), Some(1));
    }

    #[test]
    fn a_member_down_halts_its_stage_unless_the_stage_lets_it_be_missing() {
        let stages = fleet_stages(false, 0);
        let mut fleet = Fleet::changed();
        fleet.a_reachable = false;
        let started = fleet.step(&stages, &Tracks::new(), 0, &[]);
        let halted = fleet.step(&stages, &started.tracks, 400, &[]);
        assert_eq!(
            halted.tracks["cm"].phase,
            Phase::Halted(vec!["cluster a unreachable".to_owned()])
        );
        assert_eq!(through(&halted), Some(0), "eu's members are not written to");
        let tolerant = fleet_stages(false, 1);
        let started = fleet.step(&tolerant, &Tracks::new(), 0, &[]);
        let on = fleet.step(&tolerant, &started.tracks, 60, &[]);
        assert_eq!(through(&on), Some(1), "one member may be missing");
    }

    #[test]
    fn approvals_are_read_from_the_annotation() {
        let read = approvals(Some("eu=00000000000000aa, rest=00000000000000bb junk"));
        assert_eq!(
            read,
            BTreeSet::from([
                ("eu".to_owned(), NEW.to_owned()),
                ("rest".to_owned(), "00000000000000bb".to_owned())
            ])
        );
        assert!(approvals(None).is_empty());
    }
}
