// Opens Sublet's live page in headless Chromium (driven over the DevTools protocol by
// npm puppeteer-core), with a fake microphone playing a recorded question, and reports
// what the page showed as JSON lines on stdout; writes a screenshot.
//
//   node view_browser.cjs PAGE_URL CHROMIUM WAV SCREENSHOT [SECONDS]
//
// Exits 0 once the page has shown the caller's final transcript, the agent's reply, a
// turn's stage bars and the engine's KV figure; 1 (after printing what it saw) if that
// has not happened within SECONDS (default 90).
"use strict";

const puppeteer = require("puppeteer-core");

async function main() {
  const [pageUrl, chromium, wav, screenshot, seconds = "90"] = process.argv.slice(2);
  if (!screenshot) {
    console.error("usage: view_browser.cjs PAGE_URL CHROMIUM WAV SCREENSHOT [SECONDS]");
    process.exit(2);
  }
  const browser = await puppeteer.launch({
    executablePath: chromium,
    headless: true,
    args: [
      "--no-sandbox",
      "--use-fake-ui-for-media-stream",
      "--use-fake-device-for-media-stream",
      `--use-file-for-fake-audio-capture=${wav}%noloop`,
      "--autoplay-policy=no-user-gesture-required",
      // Host candidates as addresses, not mDNS names the test server cannot resolve.
      "--disable-features=WebRtcHideLocalIpsWithMdns",
    ],
  });
  let code = 1;
  try {
    const page = await browser.newPage();
    await page.setViewport({ width: 1280, height: 860 });
    page.on("console", (m) => console.error(`page: ${m.type()}: ${m.text()}`));
    page.on("pageerror", (e) => console.error(`page error: ${e}`));
    await page.goto(`${pageUrl}?autostart&debug`, { waitUntil: "load" });
    // Every partial transcript the page shows, as it shows it.
    await page.evaluate(() => {
      window.partialsSeen = [];
      const partial = document.getElementById("partial");
      new MutationObserver(() => {
        if (partial.textContent) window.partialsSeen.push(partial.textContent);
      }).observe(partial, { childList: true, characterData: true, subtree: true });
    });
    const seen = () =>
      page.evaluate(() => ({
        status: document.getElementById("status").textContent,
        agentState: document.getElementById("agent-state").textContent,
        caller: [...document.querySelectorAll("#transcript .caller")].map((e) => e.textContent),
        agent: [...document.querySelectorAll("#transcript .agent")].map((e) => e.textContent),
        partials: window.partialsSeen,
        turns: [...document.querySelectorAll("#turns .turn")].map((e) => ({
          text: e.textContent,
          bars: e.querySelectorAll(".bar span").length,
        })),
        engine: document.getElementById("engine").textContent,
      }));
    const deadline = Date.now() + Number(seconds) * 1000;
    let last;
    while (Date.now() < deadline) {
      last = await seen();
      const done =
        last.caller.length > 0 &&
        last.agent.some((t) => t.trim().length > 0) &&
        last.turns.some((t) => t.bars > 0) &&
        /KV \d+ of \d+ tokens/.test(last.engine);
      if (done) {
        // One more second for the engine panel and the agent's state to settle.
        await new Promise((r) => setTimeout(r, 1000));
        last = await seen();
        code = 0;
        break;
      }
      await new Promise((r) => setTimeout(r, 250));
    }
    await page.screenshot({ path: screenshot, fullPage: true });
    console.log(JSON.stringify({ event: "page", ...last }));
    // Leave as a person closing the call would, so the agent hears the caller go.
    await page.evaluate(() => window.subletRoom && window.subletRoom.disconnect());
  } finally {
    await browser.close();
  }
  process.exit(code);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
