// Drives a real headless Chromium (Debian's) for the Python tests: reads one JSON command a line
// on stdin, answers one JSON line on stdout. Commands:
//   {"goto": url}                                  open a page
//   {"waitText": [selector, text], "timeout": ms}  until the element's text contains text
//   {"rows": selector}                             the table's body rows, as arrays of cell texts
//   {"text": selector}                             the element's text
//   {"screenshot": path}                           a full-page PNG
//   {"fill": [selector, text]}                     types text into an input
//   {"click": selector}                            clicks the element
//   {"eval": expression}                           the expression's value in the page (JSON)
// Every wait is bounded; the browser closes when stdin does.
import { createInterface } from 'node:readline';
import { chromium } from 'playwright-core';

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
  headless: true,
  timeout: 60_000,
  args: [
    '--headless',
    '--no-sandbox',
    '--disable-gpu',
    '--disable-background-networking',
    '--disable-component-update',
    '--disable-sync',
    '--no-first-run',
  ],
});
const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
const errors = [];
page.on('pageerror', (e) => errors.push(String(e)));

async function run(cmd) {
  if (cmd.goto) {
    const r = await page.goto(cmd.goto, { timeout: 30_000 });
    return { status: r?.status() ?? 0 };
  }
  if (cmd.waitText) {
    const [selector, text] = cmd.waitText;
    await page.waitForFunction(
      ([s, t]) => (document.querySelector(s)?.textContent ?? '').includes(t),
      [selector, text],
      { timeout: cmd.timeout ?? 30_000, polling: 100 },
    );
    return {};
  }
  if (cmd.rows) {
    return {
      rows: await page.$$eval(`${cmd.rows} tbody tr`, (trs) =>
        trs.map((tr) => [...tr.cells].map((td) => td.textContent)),
      ),
    };
  }
  if (cmd.text) return { text: await page.textContent(cmd.text, { timeout: 10_000 }) };
  if (cmd.screenshot) {
    await page.screenshot({ path: cmd.screenshot, fullPage: true });
    return {};
  }
  if (cmd.fill) {
    await page.fill(cmd.fill[0], cmd.fill[1], { timeout: 10_000 });
    return {};
  }
  if (cmd.click) {
    await page.click(cmd.click, { timeout: 10_000 });
    return {};
  }
  if (cmd.eval) return { value: await page.evaluate(cmd.eval) };
  throw new Error(`unknown command ${JSON.stringify(cmd)}`);
}

for await (const line of createInterface({ input: process.stdin })) {
  if (!line.trim()) continue;
  let answer;
  try {
    answer = { ok: true, ...(await run(JSON.parse(line))) };
  } catch (err) {
    answer = { ok: false, error: String(err?.message ?? err) };
  }
  process.stdout.write(`${JSON.stringify({ ...answer, pageErrors: errors.splice(0) })}\n`);
}
await browser.close();
