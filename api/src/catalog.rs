//! The API's in-memory catalog: series, events and markets for discovery.
//!
//! Loaded from the read store at start and refreshed incrementally
//! ([`ReadStore::catalog_changes`]), so listing and searching 100 000
//! markets is a scan of memory rather than a query per request — and works
//! the same on a store that cannot search text. History routes do not use it:
//! they look markets and tokens up in the store, which is always fresh.
//!
//! Each list keeps, per sort field, the items in ascending and descending
//! order (nulls last in both). A page resumes strictly after its cursor's
//! sort key `(key, id)`, so pages stay correct while records change
//! underneath: nothing is skipped or repeated that did not move.

use crate::cursor::ListCursor;
use hindsight_contracts::ReadStore;
use hindsight_schemas::{Event, EventRecord, MarketRecord, SeriesRecord, Timestamp};
use std::cmp::Ordering;
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

/// Sort fields of discovery lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortField {
    CreatedAt,
    UpdatedAt,
    StartDate,
    EndDate,
}

impl SortField {
    pub const ALL: [SortField; 4] = [
        SortField::CreatedAt,
        SortField::UpdatedAt,
        SortField::StartDate,
        SortField::EndDate,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SortField::CreatedAt => "created_at",
            SortField::UpdatedAt => "updated_at",
            SortField::StartDate => "start_date",
            SortField::EndDate => "end_date",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.as_str() == s)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortOrder {
    Asc,
    Desc,
}

/// A catalog record that can be listed.
pub trait Listed {
    fn id(&self) -> &str;
    fn sort_key(&self, field: SortField) -> Option<i64>;
    /// Lowercased text that `search` matches.
    fn search_text(&self) -> String;
}

impl<T: Listed> Listed for Arc<T> {
    fn id(&self) -> &str {
        (**self).id()
    }
    fn sort_key(&self, field: SortField) -> Option<i64> {
        (**self).sort_key(field)
    }
    fn search_text(&self) -> String {
        (**self).search_text()
    }
}

/// The sort key of a record with these dates.
fn key_of(
    f: SortField,
    created: Timestamp,
    updated: Timestamp,
    start: Option<Timestamp>,
    end: Option<Timestamp>,
) -> Option<i64> {
    match f {
        SortField::CreatedAt => Some(created.0),
        SortField::UpdatedAt => Some(updated.0),
        SortField::StartDate => start.map(|t| t.0),
        SortField::EndDate => end.map(|t| t.0),
    }
}

impl Listed for SeriesRecord {
    fn id(&self) -> &str {
        &self.id
    }
    fn sort_key(&self, f: SortField) -> Option<i64> {
        key_of(
            f,
            self.created_at,
            self.updated_at,
            self.start_date,
            self.end_date,
        )
    }
    fn search_text(&self) -> String {
        format!("{}\n{}", self.title, self.slug).to_lowercase()
    }
}

impl Listed for EventRecord {
    fn id(&self) -> &str {
        &self.id
    }
    fn sort_key(&self, f: SortField) -> Option<i64> {
        key_of(
            f,
            self.created_at,
            self.updated_at,
            self.start_date,
            self.end_date,
        )
    }
    fn search_text(&self) -> String {
        format!("{}\n{}", self.title, self.slug).to_lowercase()
    }
}

impl Listed for MarketRecord {
    fn id(&self) -> &str {
        &self.id
    }
    fn sort_key(&self, f: SortField) -> Option<i64> {
        key_of(
            f,
            self.created_at,
            self.updated_at,
            self.start_date,
            self.end_date,
        )
    }
    fn search_text(&self) -> String {
        format!("{}\n{}", self.question.as_deref().unwrap_or(""), self.slug).to_lowercase()
    }
}

/// Position of an item in a sort order: nulls last, then key, then id.
fn position_cmp(order: SortOrder, a: (Option<i64>, &str), b: (Option<i64>, &str)) -> Ordering {
    match (a.0, b.0) {
        (None, Some(_)) => Ordering::Greater,
        (Some(_), None) => Ordering::Less,
        _ => {
            let natural = a.0.cmp(&b.0).then_with(|| a.1.cmp(b.1));
            match order {
                SortOrder::Asc => natural,
                SortOrder::Desc => natural.reverse(),
            }
        }
    }
}

/// The search texts of a list's items, end to end in one buffer: a search
/// reads every one of them, and 100 000 texts allocated one by one lie
/// wherever the allocator put them, so the scan waited on a cache miss per
/// text (an allocation pattern elsewhere in the process made a search
/// eight times slower). In one buffer the scan is sequential.
struct SearchTexts {
    text: String,
    /// Where each item's text ends in `text`.
    ends: Vec<usize>,
}

impl SearchTexts {
    fn of<T: Listed>(items: &[T]) -> Self {
        let mut text = String::new();
        let mut ends = Vec::with_capacity(items.len());
        for item in items {
            text.push_str(&item.search_text());
            ends.push(text.len());
        }
        SearchTexts { text, ends }
    }

    /// Per item, whether its text contains `needle`.
    ///
    /// One scan of the whole buffer, not a search per text: `str::contains`
    /// sets up its searcher anew on each of 100 000 texts, which was most of
    /// a search's time. The scan goes on from the next text after the
    /// first match starting in one: a hit if the match ends within the
    /// text; if it runs into the next text, none starting later in this
    /// one can end within it.
    fn matching(&self, needle: &str) -> Vec<bool> {
        let mut hits = vec![needle.is_empty(); self.ends.len()];
        if needle.is_empty() {
            return hits;
        }
        let finder = memchr::memmem::Finder::new(needle.as_bytes());
        let text = self.text.as_bytes();
        let mut from = 0;
        while let Some(found) = finder.find(&text[from..]) {
            let start = from + found;
            // The text holding `start`: the first to end past it.
            let i = self.ends.partition_point(|&end| end <= start);
            let end = self.ends[i];
            hits[i] = start + needle.len() <= end;
            from = end;
        }
        hits
    }
}

/// One kind of record, with its search texts and sort orders.
pub struct List<T> {
    pub items: Vec<T>,
    search: SearchTexts,
    /// Per sort field: (ascending, descending) item indices.
    orders: Vec<(Vec<u32>, Vec<u32>)>,
}

impl<T: Listed> List<T> {
    fn build(items: Vec<T>) -> Self {
        let search = SearchTexts::of(&items);
        let orders = SortField::ALL
            .iter()
            .map(|&f| {
                let mut asc: Vec<u32> = (0..items.len() as u32).collect();
                asc.sort_by(|&a, &b| {
                    let (a, b) = (&items[a as usize], &items[b as usize]);
                    position_cmp(
                        SortOrder::Asc,
                        (a.sort_key(f), a.id()),
                        (b.sort_key(f), b.id()),
                    )
                });
                let nulls = asc
                    .iter()
                    .filter(|&&i| items[i as usize].sort_key(f).is_none())
                    .count();
                let split = asc.len() - nulls;
                let mut desc: Vec<u32> = asc[..split].iter().rev().copied().collect();
                desc.extend(asc[split..].iter().rev());
                (asc, desc)
            })
            .collect();
        List {
            items,
            search,
            orders,
        }
    }

    /// One page: items passing `keep` in the order, after `after`, at most
    /// `limit`, and the cursor of the next page when there is one.
    pub fn page(
        &self,
        field: SortField,
        order: SortOrder,
        after: Option<&ListCursor>,
        search: Option<&str>,
        limit: usize,
        keep: impl Fn(&T) -> bool,
    ) -> (Vec<&T>, Option<ListCursor>) {
        let idx = SortField::ALL
            .iter()
            .position(|f| *f == field)
            .expect("every field is indexed");
        let sequence = match order {
            SortOrder::Asc => &self.orders[idx].0,
            SortOrder::Desc => &self.orders[idx].1,
        };
        let start = match after {
            None => 0,
            Some(c) => sequence.partition_point(|&i| {
                let item = &self.items[i as usize];
                position_cmp(order, (item.sort_key(field), item.id()), (c.key, &c.id))
                    != Ordering::Greater
            }),
        };
        // Every text is searched, in storage order, before the walk in sort
        // order: a sequential scan, where the walk's order is a random one.
        let hits = search.map(|s| self.search.matching(s));
        let mut out = Vec::with_capacity(limit.min(1024));
        let mut more = false;
        for &i in &sequence[start..] {
            let i = i as usize;
            if hits.as_ref().is_some_and(|h| !h[i]) || !keep(&self.items[i]) {
                continue;
            }
            if out.len() == limit {
                more = true;
                break;
            }
            out.push(&self.items[i]);
        }
        let next = if more {
            out.last().map(|last| ListCursor {
                key: last.sort_key(field),
                id: last.id().to_string(),
            })
        } else {
            None
        };
        (out, next)
    }
}

/// An immutable view of the catalog; requests hold one while they list.
pub struct Snapshot {
    pub series: List<Arc<SeriesRecord>>,
    pub events: List<Arc<EventRecord>>,
    pub markets: List<Arc<MarketRecord>>,
    event_index: HashMap<String, usize>,
    event_slugs: HashMap<String, String>,
    series_slugs: HashMap<String, String>,
    /// Every tag of series and events, sorted.
    pub tags: Vec<String>,
}

impl Snapshot {
    fn build(records: &Records) -> Self {
        let mut series: Vec<Arc<SeriesRecord>> = records.series.values().cloned().collect();
        let mut events: Vec<Arc<EventRecord>> = records.events.values().cloned().collect();
        let mut markets: Vec<Arc<MarketRecord>> = records.markets.values().cloned().collect();
        series.sort_by(|a, b| a.id.cmp(&b.id));
        events.sort_by(|a, b| a.id.cmp(&b.id));
        markets.sort_by(|a, b| a.id.cmp(&b.id));
        let tags: BTreeSet<String> = series
            .iter()
            .flat_map(|s| s.tags.iter())
            .chain(events.iter().flat_map(|e| e.tags.iter()))
            .cloned()
            .collect();
        let event_index = events
            .iter()
            .enumerate()
            .map(|(i, e)| (e.id.clone(), i))
            .collect();
        let event_slugs = events
            .iter()
            .map(|e| (e.slug.clone(), e.id.clone()))
            .collect();
        let series_slugs = series
            .iter()
            .map(|s| (s.slug.clone(), s.id.clone()))
            .collect();
        Snapshot {
            series: List::build(series),
            events: List::build(events),
            markets: List::build(markets),
            event_index,
            event_slugs,
            series_slugs,
            tags: tags.into_iter().collect(),
        }
    }

    /// The event a market belongs to, if known.
    pub fn event_of(&self, market: &MarketRecord) -> Option<&Arc<EventRecord>> {
        let id = market.event_id.as_deref()?;
        self.event_index.get(id).map(|&i| &self.events.items[i])
    }

    pub fn event_id_by_slug(&self, slug: &str) -> Option<&str> {
        self.event_slugs.get(slug).map(String::as_str)
    }

    pub fn series_id_by_slug(&self, slug: &str) -> Option<&str> {
        self.series_slugs.get(slug).map(String::as_str)
    }
}

/// The latest version of every record; snapshots share them.
#[derive(Default)]
struct Records {
    series: HashMap<String, Arc<SeriesRecord>>,
    events: HashMap<String, Arc<EventRecord>>,
    markets: HashMap<String, Arc<MarketRecord>>,
    /// Change position of the newest change applied.
    since: Option<hindsight_contracts::CatalogCursor>,
}

/// Keeps `record` unless a newer version (by `updated_at`) is held.
fn newest<T: Versioned>(
    map: &mut HashMap<String, Arc<T>>,
    id: String,
    updated: Timestamp,
    record: T,
) {
    match map.get(&id) {
        Some(held) if held.updated_at() > updated => {}
        _ => drop(map.insert(id, Arc::new(record))),
    }
}

trait Versioned {
    fn updated_at(&self) -> Timestamp;
}

impl Versioned for SeriesRecord {
    fn updated_at(&self) -> Timestamp {
        self.updated_at
    }
}

impl Versioned for EventRecord {
    fn updated_at(&self) -> Timestamp {
        self.updated_at
    }
}

impl Versioned for MarketRecord {
    fn updated_at(&self) -> Timestamp {
        self.updated_at
    }
}

pub struct Catalog {
    store: Arc<dyn ReadStore>,
    records: Mutex<Records>,
    current: RwLock<Arc<Snapshot>>,
}

impl Catalog {
    /// An empty catalog; call [`Catalog::refresh`] to load it.
    pub fn new(store: Arc<dyn ReadStore>) -> Arc<Self> {
        let records = Records::default();
        let current = RwLock::new(Arc::new(Snapshot::build(&records)));
        Arc::new(Catalog {
            store,
            records: Mutex::new(records),
            current,
        })
    }

    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.current.read().unwrap().clone()
    }

    /// Applies the store's changes since the last refresh; rebuilds the
    /// snapshot only when something changed.
    pub async fn refresh(&self) -> hindsight_contracts::Result<usize> {
        let since = self.records.lock().unwrap().since.clone();
        let (changes, cursor) = self.store.catalog_changes(since.as_ref()).await?;
        if changes.is_empty() {
            self.records.lock().unwrap().since = Some(cursor);
            return Ok(0);
        }
        let n = changes.len();
        let snapshot = {
            let mut records = self.records.lock().unwrap();
            records.since = Some(cursor);
            for event in changes {
                // A feed may deliver a change again (the ScyllaDB feed
                // re-reads a margin): never let an older version win.
                match event {
                    Event::Series(s) => newest(&mut records.series, s.id.clone(), s.updated_at, *s),
                    Event::Event(e) => newest(&mut records.events, e.id.clone(), e.updated_at, *e),
                    Event::Market(m) => {
                        newest(&mut records.markets, m.id.clone(), m.updated_at, *m)
                    }
                    _ => {}
                }
            }
            Snapshot::build(&records)
        };
        *self.current.write().unwrap() = Arc::new(snapshot);
        Ok(n)
    }

    /// Refreshes every `every` for as long as the process runs.
    pub fn spawn_refresher(self: &Arc<Self>, every: Duration) {
        let catalog = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(catalog) = catalog.upgrade() else {
                    return;
                };
                if let Err(e) = catalog.refresh().await {
                    tracing::warn!(error = %e, "catalog refresh failed; serving the previous snapshot");
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_trait::async_trait;
    use hindsight_contracts::*;
    use hindsight_schemas::Token;
    use std::sync::Mutex as StdMutex;

    /// A feed that replays whatever changes the test queues.
    #[derive(Default)]
    struct Feed(StdMutex<Vec<Event>>);

    #[async_trait]
    impl ReadStore for Feed {
        async fn prices(&self, _: &str, _: Range) -> hindsight_contracts::Result<Vec<PricePoint>> {
            Ok(vec![])
        }
        async fn candles(
            &self,
            _: &str,
            _: Range,
        ) -> hindsight_contracts::Result<Vec<CandlePoint>> {
            Ok(vec![])
        }
        async fn metrics(
            &self,
            _: &str,
            _: Range,
        ) -> hindsight_contracts::Result<Vec<MetricsPoint>> {
            Ok(vec![])
        }
        async fn books(&self, _: &str, _: Range) -> hindsight_contracts::Result<Vec<BookPoint>> {
            Ok(vec![])
        }
        async fn count(&self, _: Table, _: &str, _: Range) -> hindsight_contracts::Result<u64> {
            Ok(0)
        }
        async fn count_ticks(
            &self,
            _: TickKind,
            _: &str,
            _: Timestamp,
            _: Timestamp,
        ) -> hindsight_contracts::Result<u64> {
            Ok(0)
        }
        async fn ticks(
            &self,
            _: TickKind,
            _: &str,
            _: TickRange,
        ) -> hindsight_contracts::Result<Vec<Tick>> {
            Ok(vec![])
        }
        async fn book_at(
            &self,
            _: &str,
            _: Timestamp,
            _: Timestamp,
        ) -> hindsight_contracts::Result<Option<Tick>> {
            Ok(None)
        }
        async fn token(&self, _: &str) -> hindsight_contracts::Result<Option<TokenRef>> {
            Ok(None)
        }
        async fn market(&self, _: &str) -> hindsight_contracts::Result<Option<MarketRecord>> {
            Ok(None)
        }
        async fn catalog_changes(
            &self,
            _: Option<&CatalogCursor>,
        ) -> hindsight_contracts::Result<(Vec<Event>, CatalogCursor)> {
            let changes = std::mem::take(&mut *self.0.lock().unwrap());
            Ok((changes, CatalogCursor::default()))
        }
    }

    fn market(question: &str, updated: i64) -> Event {
        Event::Market(Box::new(MarketRecord {
            id: "m".into(),
            slug: "m".into(),
            event_id: None,
            question: Some(question.into()),
            description: None,
            status: "open".into(),
            start_date: None,
            end_date: None,
            closed_at: None,
            resolved_token_id: None,
            resolved_token_label: None,
            tokens: vec![Token {
                id: "t".into(),
                label: "Yes".into(),
            }],
            created_at: Timestamp(0),
            updated_at: Timestamp(updated),
        }))
    }

    #[tokio::test]
    async fn a_redelivered_older_version_does_not_replace_a_newer_one() {
        let feed = Arc::new(Feed::default());
        let catalog = Catalog::new(feed.clone());
        feed.0
            .lock()
            .unwrap()
            .extend([market("old", 10), market("new", 20)]);
        catalog.refresh().await.unwrap();
        feed.0.lock().unwrap().push(market("old", 10));
        catalog.refresh().await.unwrap();
        let snapshot = catalog.snapshot();
        assert_eq!(snapshot.markets.items[0].question.as_deref(), Some("new"));
        assert_eq!(snapshot.markets.items.len(), 1);
    }

    /// Texts lie end to end in one buffer, yet a search matches within one
    /// item's text only, never across the seam between two.
    #[tokio::test]
    async fn a_search_matches_within_one_item() {
        let feed = Arc::new(Feed::default());
        let catalog = Catalog::new(feed.clone());
        let with_id = |id: &str, question: &str| {
            let Event::Market(mut m) = market(question, 1) else {
                unreachable!()
            };
            m.id = id.into();
            m.slug = id.into();
            Event::Market(m)
        };
        feed.0.lock().unwrap().extend([
            with_id("a", "alpha"),
            with_id("b", "beta"),
            with_id("c", "alphabet"),
        ]);
        catalog.refresh().await.unwrap();
        let snapshot = catalog.snapshot();
        let ids = |needle: &str| {
            let (page, _) = snapshot.markets.page(
                SortField::CreatedAt,
                SortOrder::Asc,
                None,
                Some(needle),
                10,
                |_| true,
            );
            page.iter().map(|m| m.id.clone()).collect::<Vec<_>>()
        };
        assert_eq!(ids("alpha"), ["a", "c"]);
        assert_eq!(ids("bet"), ["b", "c"]);
        // "a\na" + "beta": the end of one text and the start of the next.
        assert!(ids("\nabeta").is_empty());
        assert!(ids("abeta").is_empty());
    }

    /// The one scan over the buffer finds what a search of each text finds:
    /// every needle of up to four letters over every list of up to four
    /// texts of up to three letters (empty texts, repeats and matches
    /// overlapping a seam among them).
    #[test]
    fn one_scan_finds_what_each_text_contains() {
        let words = |max: usize| -> Vec<String> {
            let mut out = vec![String::new()];
            let mut last = vec![String::new()];
            for _ in 0..max {
                last = last
                    .iter()
                    .flat_map(|w| ["a", "b"].map(|c| format!("{w}{c}")))
                    .collect();
                out.extend(last.iter().cloned());
            }
            out
        };
        let texts = words(3);
        let needles = words(4);
        let mut lists = 0;
        // Lists of four texts, read as a number in base `texts.len()`.
        for n in 0..texts.len().pow(4) {
            let list: Vec<&str> = (0..4)
                .map(|k| texts[n / texts.len().pow(k) % texts.len()].as_str())
                .collect();
            let mut text = String::new();
            let mut ends = Vec::new();
            for t in &list {
                text.push_str(t);
                ends.push(text.len());
            }
            let search = SearchTexts { text, ends };
            for needle in &needles {
                let want: Vec<bool> = list.iter().map(|t| t.contains(needle.as_str())).collect();
                assert_eq!(search.matching(needle), want, "{needle:?} in {list:?}");
            }
            lists += 1;
        }
        assert_eq!(lists, 15usize.pow(4));
    }
}
