pub fn run(_seconds: u32) -> anyhow::Result<()> {
    anyhow::bail!("bench: not written yet")
}
