//! The etcd source, flannel's etcd subnet manager (etcd v3): the network
//! config at `<prefix>/config`, one lease per node at
//! `<prefix>/subnets/<a.b.c.d>-<len>` (in dual-stack
//! `<a.b.c.d>-<len>&<ipv6>-<len>`: one key holds both families). We acquire or reuse our own lease
//! (which also restores our VTEP MAC: flannel cannot), renew it before it
//! expires, honour TTL-less reservations, and watch the rest, re-listing
//! after a compaction.
use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, Ipv6Addr},
    path::PathBuf,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, Result, bail};
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, PutOptions, Txn, TxnOp, WatchOptions,
};
use ipnet::{Ipv4Net, Ipv6Net};
use tokio::sync::mpsc;
use tracing::{error, info, warn};

use super::{
    etcd_config::{Ranges, RefusedConfig, public_ipv6_now, read_config},
    etcd_settings::EtcdSettings,
    etcd_tls, leases, own_lease, subnet_range,
};
use crate::{
    mac::VtepMac,
    metrics::Watching,
    netconf::NetConf,
    peer::{ClusterView, Desired, OwnNode},
    state::StateDir,
    vtep_mac,
};

/// What the source needs to know about this node.
#[derive(Clone, Debug)]
pub struct LocalNode {
    pub public_ip: Ipv4Addr,
    /// Our public IPv6 (`PublicIPv6`) as known at start (`--public-ipv6`,
    /// else the underlay's). Whether IPv6 is on is the etcd config's to
    /// say (`EnableIPv6`); with it on and none here, the underlay is read
    /// again (`etcd_config::public_ipv6_now`).
    pub public_ipv6: Option<Ipv6Addr>,
    /// The underlay interface.
    pub iface: String,
    /// Read for the VTEP MACs a new lease publishes
    /// ([`vtep_mac::candidate`]); the source writes nothing here.
    pub state: StateDir,
    pub subnet_file: PathBuf,
}

/// HTTP/2 pings on the connection while the lease watch is open: a link
/// that dies without a reset (an edge uplink dropping everything) fails the
/// watch within `KEEPALIVE_EVERY + KEEPALIVE_TIMEOUT` and the source says it
/// is no longer watching (`edgevx_source_watching`), instead of waiting for
/// TCP to give up hours later. etcd refuses pings more often than its
/// `--grpc-keepalive-min-time` (5 s by default).
const KEEPALIVE_EVERY: Duration = Duration::from_secs(30);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

async fn connect(s: &EtcdSettings) -> Result<Client> {
    let mut opts = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(2))
        .with_timeout(Duration::from_secs(5))
        .with_keep_alive(KEEPALIVE_EVERY, KEEPALIVE_TIMEOUT);
    if let Some(tls) = etcd_tls::options(s)? {
        opts = opts.with_tls(tls);
    }
    if let Some((name, password)) = &s.user {
        opts = opts.with_user(name.clone(), password.clone());
    }
    Client::connect(&s.endpoints, Some(opts))
        .await
        .with_context(|| format!("cannot connect to etcd at {}", s.endpoints.join(",")))
}

/// One connected session: our lease and the others.
struct Session {
    client: Client,
    settings: EtcdSettings,
    conf: NetConf,
    ranges: Ranges,
    own: Ipv4Net,
    /// Our IPv6 subnet in dual-stack.
    own6: Option<Ipv6Net>,
    own_key: String,
    own_value: String,
    /// Our PublicIP: no other lease may claim it.
    public_ip: Ipv4Addr,
    /// Our PublicIPv6 in dual-stack: no other lease may claim it either.
    public_ipv6: Option<Ipv6Addr>,
    /// 0 for a reservation (no TTL)
    lease_id: i64,
    leases: BTreeMap<String, String>,
    /// Each lease key's create revision: when it appeared (settles two
    /// leases claiming one subnet, see `reconcile::select`).
    created: BTreeMap<String, i64>,
    revision: i64,
}

fn now_seed() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

impl Session {
    fn subnets_prefix(&self) -> String {
        format!("{}/subnets/", self.settings.prefix)
    }

    /// The leases below `prefix`: key → (value, etcd lease id, create revision).
    async fn list(client: &mut Client, prefix: &str) -> Result<(BTreeMap<String, (String, i64, i64)>, i64)> {
        let resp = client.get(prefix, Some(GetOptions::new().with_prefix())).await.context("cannot list leases")?;
        let rev = resp.header().map(|h| h.revision()).unwrap_or(0);
        let mut out = BTreeMap::new();
        for kv in resp.kvs() {
            let (Ok(k), Ok(v)) = (kv.key_str(), kv.value_str()) else {
                continue;
            };
            if let Some(short) = k.strip_prefix(prefix) {
                out.insert(short.to_string(), (v.to_string(), kv.lease(), kv.create_revision()));
            }
        }
        Ok((out, rev))
    }

    /// Reads the config, then reuses or acquires our lease.
    async fn open(settings: &EtcdSettings, me: &LocalNode) -> Result<Session> {
        let mut client = connect(settings).await?;
        let config_key = format!("{}/config", settings.prefix);
        let resp = client.get(config_key.as_str(), None).await.with_context(|| format!("cannot read {config_key}"))?;
        let text = resp
            .kvs()
            .first()
            .and_then(|kv| kv.value_str().ok())
            .map(str::to_string)
            .with_context(|| format!("{config_key} does not exist (create it with the etcd v3 API)"))?;
        let (conf, ranges) = read_config(&text, &config_key)?;
        let public_ipv6 = match (&conf.ipv6, me.public_ipv6) {
            (None, _) => None,
            (Some(_), Some(ip)) => Some(ip),
            (Some(_), None) => Some(public_ipv6_now(&me.iface, &config_key).await?),
        };
        let prefix = format!("{}/subnets/", settings.prefix);
        let (mut all, revision) = Self::list(&mut client, &prefix).await?;

        // 1. our own lease, matched by PublicIP (a reservation counts); of
        //    several, the one we recorded, else the first to appear, never
        //    the first key (see own_lease)
        let mut mine = Self::own_lease(me, &conf, &ranges, &all)?;
        // the MACs we published stay ours even if the lease itself must go
        let published = mine.as_ref().map(|(_, l, _)| (l.vtep_mac, l.v6.and_then(|v6| v6.vtep_mac)));
        if let Some((key, _, _)) = mine.take_if(|(_, l, _)| !ranges.ipv6_compatible(l.v6.map(|v6| v6.subnet))) {
            // flannel deletes a lease of ours that does not fit the IPv6 config, then acquires anew
            info!(key = %key, "our lease does not fit the network config's IPv6 settings; deleting it");
            client
                .delete(format!("{prefix}{key}"), None)
                .await
                .with_context(|| format!("cannot delete {prefix}{key}"))?;
            all.remove(&key);
        }
        // the lease publishes a VtepMAC before bring-up chooses one (flannel's
        // lease carries its device's): ours as published, else the saved one or
        // a new one, which bring-up then finds published and saves
        // never a MAC another lease publishes (a state dir copied from its node)
        let mut others = vtep_mac::OthersMacs::default();
        for (k, (v, _, _)) in &all {
            let Ok(l) = leases::parse_lease(k, v, true) else { continue };
            if l.public_ip != me.public_ip {
                for m in [l.vtep_mac, l.v6.and_then(|v6| v6.vtep_mac)].into_iter().flatten() {
                    others.insert(m, format!("{prefix}{k}"));
                }
            }
        }
        let unshared = |m: &VtepMac| others.owner(*m).is_none();
        let mac = match published.and_then(|(m, _)| m).filter(unshared) {
            Some(m) => m,
            None => vtep_mac::candidate::<Ipv4Net>(&me.state, &others)?,
        };
        let mac6 = match (public_ipv6, published.and_then(|(_, m6)| m6).filter(unshared)) {
            (None, _) => None,
            (Some(_), Some(m6)) => Some(m6),
            (Some(_), None) => Some(vtep_mac::candidate::<Ipv6Net>(&me.state, &others)?),
        };
        let mut s = Session {
            client,
            settings: settings.clone(),
            own_value: leases::lease_value(me.public_ip, conf.vni, mac, public_ipv6.zip(mac6)),
            conf,
            ranges,
            own: Ipv4Net::default(),
            own6: None,
            own_key: String::new(),
            public_ip: me.public_ip,
            public_ipv6,
            lease_id: 0,
            leases: all.iter().map(|(k, (v, _, _))| (k.clone(), v.clone())).collect(),
            created: all.iter().map(|(k, (_, _, c))| (k.clone(), *c)).collect(),
            revision,
        };
        match mine {
            Some((_, l, lease)) => s.reuse(l.subnet, l.v6.map(|v6| v6.subnet), lease).await?,
            None => s.acquire(me, &all).await?,
        }
        Ok(s)
    }

    /// Our lease among those claiming our PublicIP (in the network and a
    /// `SubnetLen` block, as flannel's `isSubnetConfigCompat`): key → (its
    /// lease, its etcd lease id).
    fn own_lease(
        me: &LocalNode,
        conf: &NetConf,
        ranges: &Ranges,
        all: &BTreeMap<String, (String, i64, i64)>,
    ) -> Result<Option<(String, leases::Lease, i64)>> {
        let claims: Vec<(&String, leases::Lease, i64, i64)> = all
            .iter()
            .filter_map(|(k, (v, lease, created))| {
                let l = leases::parse_lease(k, v, true).ok()?;
                let usable = l.public_ip == me.public_ip
                    && conf.network.contains(&l.subnet)
                    && l.subnet.prefix_len() == ranges.v4.len;
                usable.then_some((k, l, *lease, *created))
            })
            .collect();
        let claimants: Vec<own_lease::Claimant<'_>> = claims
            .iter()
            .map(|(k, l, _, created)| own_lease::Claimant { key: k.as_str(), subnet: l.subnet, created: *created })
            .collect();
        // what this node recorded as its own: subnet.env (flanneld's fallback
        // too), then the cached view (the state dir outlives /run's reboot)
        let env = std::fs::read_to_string(&me.subnet_file).unwrap_or_default();
        let cached = me.state.load_view().ok().flatten().and_then(|d| d.view.own?.subnet);
        let recorded: Vec<Ipv4Net> = subnet_range::previous_subnet(&env).into_iter().chain(cached).collect();
        let Some(i) = own_lease::choose(&claimants, &recorded, me.public_ip)? else { return Ok(None) };
        if claims.len() > 1 {
            let others: Vec<&str> =
                claims.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, c)| c.0.as_str()).collect();
            warn!(
                ours = %claims[i].0, others = ?others, public_ip = %me.public_ip,
                "other leases claim this node's PublicIP; keeping ours (recorded, else the first to appear) and \
                 refusing them as peers"
            );
        }
        Ok(claims.into_iter().nth(i).map(|(k, l, lease, _)| (k.clone(), l, lease)))
    }

    async fn reuse(&mut self, subnet: Ipv4Net, subnet6: Option<Ipv6Net>, lease: i64) -> Result<()> {
        self.own = subnet;
        self.own6 = subnet6;
        self.own_key = format!("{}{}", self.subnets_prefix(), leases::subnet_key(subnet, subnet6));
        if lease == 0 {
            // a reservation: keep it TTL-less, refresh our backend data in it
            self.client
                .put(self.own_key.as_str(), self.own_value.as_str(), None)
                .await
                .context("cannot update our reservation")?;
            info!(subnet = %subnet, subnet6 = ?subnet6, "using our reserved subnet");
        } else {
            self.grant_and_put().await?;
            info!(subnet = %subnet, subnet6 = ?subnet6, "reusing our lease");
        }
        Ok(())
    }

    async fn grant_and_put(&mut self) -> Result<()> {
        let ttl = self.settings.lease_ttl.as_secs().max(1) as i64;
        let id = self.client.lease_grant(ttl, None).await.context("cannot grant an etcd lease")?.id();
        self.client
            .put(self.own_key.as_str(), self.own_value.as_str(), Some(PutOptions::new().with_lease(id)))
            .await
            .context("cannot write our lease")?;
        self.lease_id = id;
        Ok(())
    }

    /// A new lease: IPv4 and (dual-stack) IPv6 subnets picked apart, each
    /// preferring what subnet.env says we had, as flannel's `allocateSubnet`.
    async fn acquire(&mut self, me: &LocalNode, all: &BTreeMap<String, (String, i64, i64)>) -> Result<()> {
        let env = std::fs::read_to_string(&me.subnet_file).unwrap_or_default();
        let (previous, previous6) = (subnet_range::previous_subnet(&env), subnet_range::previous_subnet(&env));
        let keys: Vec<(Ipv4Net, Option<Ipv6Net>)> = all.keys().filter_map(|k| leases::parse_key(k)).collect();
        let mut taken: Vec<Ipv4Net> = keys.iter().map(|(n, _)| *n).collect();
        let mut taken6: Vec<Ipv6Net> = keys.iter().filter_map(|(_, n6)| *n6).collect();
        let range = self.ranges.v4;
        for attempt in 0..10u64 {
            let Some(subnet) = subnet_range::allocate(range, &taken, previous, now_seed() ^ attempt) else {
                bail!("no free subnet left in {} between {} and {}", self.conf.network, range.min, range.max);
            };
            let subnet6 = match (self.ranges.v6, &self.conf.ipv6) {
                (Some(r6), Some(v6)) => match subnet_range::allocate(r6, &taken6, previous6, now_seed() ^ attempt) {
                    Some(n6) => Some(n6),
                    None => bail!("no free IPv6 subnet left in {} between {} and {}", v6.network, r6.min, r6.max),
                },
                _ => None,
            };
            let key = format!("{}{}", self.subnets_prefix(), leases::subnet_key(subnet, subnet6));
            let ttl = self.settings.lease_ttl.as_secs().max(1) as i64;
            let id = self.client.lease_grant(ttl, None).await.context("cannot grant an etcd lease")?.id();
            let txn = Txn::new().when([Compare::version(key.as_str(), CompareOp::Equal, 0)]).and_then([TxnOp::put(
                key.as_str(),
                self.own_value.as_str(),
                Some(PutOptions::new().with_lease(id)),
            )]);
            if self.client.txn(txn).await.context("cannot create our lease")?.succeeded() {
                info!(subnet = %subnet, subnet6 = ?subnet6, "acquired a new lease");
                self.own = subnet;
                self.own6 = subnet6;
                self.own_key = key;
                self.lease_id = id;
                return Ok(());
            }
            // someone else took it first: try another one
            let _ = self.client.lease_revoke(id).await;
            taken.push(subnet);
            taken6.extend(subnet6);
        }
        bail!("lost the race for a subnet 10 times")
    }

    /// Our key below `<prefix>/subnets/`.
    fn own_short_key(&self) -> String {
        leases::subnet_key(self.own, self.own6)
    }

    fn desired(&self) -> Desired {
        let reader = leases::Reader {
            network: self.conf.network,
            network6: self.conf.ipv6.as_ref().map(|v6| v6.network),
            own: Some(self.own),
            own_ip: self.public_ip,
            own_ip6: self.public_ipv6,
            subnet_len: self.ranges.v4.len,
            subnet_len6: self.ranges.v6.map(|r| r.len),
        };
        let ours = leases::parse_lease(&self.own_short_key(), &self.own_value, self.own6.is_some()).ok();
        Desired {
            conf: self.conf.clone(),
            view: ClusterView {
                own: Some(OwnNode {
                    subnet: Some(self.own),
                    published_mac: ours.as_ref().and_then(|l| l.vtep_mac),
                    node_public_ip: None,
                    subnet6: self.own6,
                    published_mac6: ours.as_ref().and_then(|l| l.v6?.vtep_mac),
                    // the address our lease publishes is the IPv6 VTEP's source,
                    // even if the underlay's changed since (flannel: one ExtV6Addr)
                    node_public_ipv6: self.public_ipv6,
                }),
                ..reader.peers(&self.leases, &self.created)
            },
        }
    }

    /// Renews our lease: a fresh lease and a re-put, as flanneld does.
    async fn renew(&mut self) -> Result<()> {
        if self.lease_id == 0 {
            return Ok(());
        }
        let resp = self.client.get(self.own_key.as_str(), None).await.context("cannot read our lease")?;
        if resp.kvs().is_empty() {
            warn!(key = %self.own_key, "our lease was revoked or expired; writing it again");
        }
        let old = self.lease_id;
        self.grant_and_put().await?;
        let _ = self.client.lease_revoke(old).await;
        info!(subnet = %self.own, subnet6 = ?self.own6, ttl = ?self.settings.lease_ttl, "lease renewed");
        Ok(())
    }

    /// Watches leases until an error; sends a view after every change.
    /// `watching` is on while a watch is open.
    async fn follow(&mut self, tx: &mpsc::Sender<Desired>, watching: &Watching) -> Result<()> {
        let prefix = self.subnets_prefix();
        let renew_every =
            self.settings.lease_ttl.saturating_sub(self.settings.renew_margin).max(Duration::from_secs(1));
        let mut renew = tokio::time::interval_at(tokio::time::Instant::now() + renew_every, renew_every);
        loop {
            let opts = WatchOptions::new().with_prefix().with_start_revision(self.revision + 1);
            let mut stream = self.client.watch(prefix.as_str(), Some(opts)).await.context("cannot watch leases")?;
            watching.on();
            loop {
                tokio::select! {
                    _ = renew.tick() => self.renew().await?,
                    msg = stream.message() => {
                        let Some(resp) = msg.context("lease watch failed")? else { bail!("lease watch ended") };
                        if resp.compact_revision() > 0 || resp.canceled() {
                            warn!(compacted = resp.compact_revision(), "lease watch fell behind a compaction; listing again");
                            let (all, rev) = Self::list(&mut self.client, &prefix).await?;
                            self.created = all.iter().map(|(k, (_, _, c))| (k.clone(), *c)).collect();
                            self.leases = all.into_iter().map(|(k, (v, _, _))| (k, v)).collect();
                            self.revision = rev;
                            tx.send(self.desired()).await.ok();
                            break;
                        }
                        if let Some(h) = resp.header() {
                            self.revision = self.revision.max(h.revision());
                        }
                        let mut changed = false;
                        for ev in resp.events() {
                            let Some(kv) = ev.kv() else { continue };
                            let Ok(key) = kv.key_str() else { continue };
                            let Some(short) = key.strip_prefix(prefix.as_str()) else { continue };
                            match ev.event_type() {
                                EventType::Put => {
                                    if let Ok(v) = kv.value_str() {
                                        self.leases.insert(short.to_string(), v.to_string());
                                        self.created.insert(short.to_string(), kv.create_revision());
                                    }
                                }
                                EventType::Delete => {
                                    self.leases.remove(short);
                                    self.created.remove(short);
                                    if short == self.own_short_key() {
                                        warn!("our lease disappeared; writing it again");
                                        self.renew().await?;
                                    }
                                }
                            }
                            changed = true;
                        }
                        if changed && tx.send(self.desired()).await.is_err() {
                            return Ok(());
                        }
                    }
                }
            }
        }
    }
}

/// Runs the etcd source until the receiver is gone, reconnecting with
/// backoff. Nothing is sent while etcd cannot be read, so peers stay;
/// `watching` says whether the lease watch is open.
pub fn run(
    settings: EtcdSettings,
    me: LocalNode,
    tx: mpsc::Sender<Desired>,
    watching: Watching,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let (min, max) = (Duration::from_millis(500), Duration::from_secs(10));
        let mut delays = super::retry::delays(min, max);
        loop {
            let mut backoff = delays.next().unwrap_or(max);
            match Session::open(&settings, &me).await {
                Ok(mut s) => {
                    // a session that opened starts the back-off over
                    delays = super::retry::delays(min, max);
                    backoff = delays.next().unwrap_or(max);
                    if tx.send(s.desired()).await.is_err() {
                        return;
                    }
                    let ended = s.follow(&tx, &watching).await;
                    watching.off();
                    if let Err(e) = ended {
                        match etcd_tls::explain(&e, &settings) {
                            Some(tls) => warn!("etcd session ended, reconnecting: {tls} ({e:#})"),
                            None => warn!("etcd session ended, reconnecting: {e:#}"),
                        }
                    }
                    if tx.is_closed() {
                        return;
                    }
                }
                Err(e) => {
                    if let Some(refused) = e.downcast_ref::<RefusedConfig>() {
                        // a usage error found late: the same exit as a bad flag. Whatever the
                        // agent restored from its cache stays in place, as after any stop.
                        error!("refusing the etcd network config: {refused}");
                        std::process::exit(2);
                    }
                    match etcd_tls::explain(&e, &settings) {
                        Some(tls) => warn!("etcd is not usable, retrying in {backoff:?}: {tls} ({e:#})"),
                        None => warn!("etcd is not usable, retrying in {backoff:?}: {e:#}"),
                    }
                }
            }
            tokio::time::sleep(backoff).await;
        }
    })
}
