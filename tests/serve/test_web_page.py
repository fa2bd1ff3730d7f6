#!/usr/bin/env python3
"""The web page of `zimage serve` in real headless Chromium (selenium + Debian's chromedriver).

Starts `zimage serve --port 0` on the tiny model, then in the browser: an invalid request shows
a clear error; a job's progress bar reaches 100 %, a live preview appears before its image lands
in the gallery with its parameters; "reuse settings" fills the form back; image-to-image and
inpainting submit and return images, the mask painter's mask (scripted strokes, eraser, undo) is
the mask sent, pixel for pixel; the history survives a reload, delete sticks; Ctrl+Enter
generates; the page fits a phone's width with no external URL; a long job is cancelled from its
card. A screenshot of each state goes to --out. Loopback only. Without
chromium/chromedriver/selenium this test FAILS (scripts/setup.sh installs them).

  test_web_page.py --zimage build/cpu/zimage --model build/cpu/golden/v_turbo/model --out DIR
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from web_page_util import disc_mask, png_decode, png_gray, png_rgb, script_stroke


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def start_server(zimage, model):
    proc = subprocess.Popen(
        [zimage, "serve", "--model", model, "--port", "0", "--device", "cpu", "--threads", "2",
         "--default-size", "64x64", "--default-steps", "4", "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    port = None
    deadline = time.time() + 60
    lines = []

    def reader():
        for line in proc.stdout:
            lines.append(line)

    threading.Thread(target=reader, daemon=True).start()
    while time.time() < deadline:
        for line in list(lines):
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                port = int(m.group(1))
            if "ready" in line and port:
                return proc, port
        if proc.poll() is not None:
            fail("zimage serve exited early: %s" % "".join(lines))
        time.sleep(0.05)
    proc.kill()
    fail("zimage serve did not become ready")


def api(port, path):
    with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=10) as r:
        return json.loads(r.read())


def make_driver():
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        fail("python3-selenium is not installed (scripts/setup.sh installs it)")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    if not chromium or not os.path.exists(driver_path):
        fail("chromium / chromedriver are not installed (scripts/setup.sh installs them)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
              "--no-first-run", "--disable-extensions", "--disable-background-networking",
              "--user-data-dir=" + tempfile.mkdtemp(prefix="zimage-chromium-")):
        opts.add_argument(a)
    return webdriver.Chrome(service=Service(driver_path), options=opts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--zimage", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", default=tempfile.mkdtemp(prefix="zimage-web-"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    t_start = time.time()

    proc, port = start_server(args.zimage, args.model)
    driver = None
    try:
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import WebDriverWait

        driver = make_driver()
        driver.set_window_size(1280, 1000)
        wait = WebDriverWait(driver, 60)

        def shot(name):
            driver.save_screenshot(os.path.join(args.out, name + ".png"))

        driver.get("http://127.0.0.1:%d/" % port)
        wait.until(lambda d: "z-image-turbo" in d.find_element(By.ID, "server-status").text)
        assert driver.find_element(By.ID, "width").get_attribute("value") == "64"

        def fill(field, value):
            el = driver.find_element(By.ID, field)
            el.clear()
            el.send_keys(str(value))

        # 1. A clear error: a size that is not a multiple of the model's factor.
        fill("prompt", "an error on purpose")
        fill("width", "63")
        driver.find_element(By.ID, "generate").click()
        wait.until(lambda d: d.find_element(By.ID, "error").text != "")
        err = driver.find_element(By.ID, "error").text
        if "size" not in err or "63" not in err:
            fail("unclear error message: %r" % err)

        # 2. A job: progress to 100 %, image in the gallery with its parameters.
        fill("width", "64")
        fill("prompt", "a small red fox")
        fill("steps", "6")
        driver.find_element(By.ID, "random-seed").click()  # off: a fixed seed
        fill("seed", "31337")
        driver.find_element(By.ID, "generate").click()
        wait.until(lambda d: d.find_element(By.ID, "error").text == "")
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".job[data-state='done']"))
        job = driver.find_element(By.CSS_SELECTOR, ".job[data-state='done']")
        if job.get_attribute("data-percent") != "100":
            fail("progress did not reach 100 %%: %s" % job.get_attribute("data-percent"))
        if "100 %" not in job.find_element(By.CLASS_NAME, "status").text:
            fail("status text: %r" % job.find_element(By.CLASS_NAME, "status").text)
        bar = job.find_element(By.TAG_NAME, "progress")
        if bar.get_attribute("value") != bar.get_attribute("max"):
            fail("progress bar not full")
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#gallery img"))
        img = driver.find_element(By.CSS_SELECTOR, "#gallery img")
        wait.until(lambda d: d.execute_script(
            "return arguments[0].complete && arguments[0].naturalWidth", img) == 64)
        caption = driver.find_element(By.CSS_SELECTOR, "#gallery figcaption").text
        for part in ("a small red fox", "64×64", "6 steps", "seed 31337"):
            if part not in caption:
                fail("caption %r lacks %r" % (caption, part))
        # A live preview appeared on the job's card before the image reached the gallery.
        first_preview = job.get_attribute("data-first-preview-at")
        added = driver.find_element(By.CSS_SELECTOR, "#gallery figure").get_attribute("data-added-at")
        if not first_preview or float(first_preview) >= float(added):
            fail("no preview before the final image: preview at %r, image at %r" % (first_preview, added))
        if int(job.get_attribute("data-previews")) < 1:
            fail("no preview event shown")
        shot("1-txt2img-done")
        link = driver.find_element(By.CSS_SELECTOR, "#gallery figcaption a[download]")
        if not link.get_attribute("href").startswith("blob:"):
            fail("download link: %r" % link.get_attribute("href"))
        # The job's progress events were all seen: the server agrees the job succeeded.
        job_id = job.get_attribute("data-id")
        if api(port, "/v1/jobs/" + job_id)["status"] != "succeeded":
            fail("server does not report the job as succeeded")

        # 3. Reuse settings fills the form back.
        fill("prompt", "something else")
        fill("steps", "2")
        driver.find_element(By.CSS_SELECTOR, "#gallery button.reuse").click()
        if driver.find_element(By.ID, "prompt").get_attribute("value") != "a small red fox":
            fail("reuse settings did not restore the prompt")
        if driver.find_element(By.ID, "steps").get_attribute("value") != "6":
            fail("reuse settings did not restore the steps")
        if driver.find_element(By.ID, "seed").get_attribute("value") != "31337":
            fail("reuse settings did not restore the seed")

        # 4. Image to image: upload a start image, strength, submit: an image comes back.
        start_png = os.path.join(args.out, "start.png")
        with open(start_png, "wb") as f:
            f.write(png_rgb(64, 64, lambda x, y: (4 * x, 4 * y, 128)))
        driver.find_element(By.CSS_SELECTOR, "input[name=mode][value=img2img]").click()
        driver.find_element(By.ID, "init-file").send_keys(start_png)
        wait.until(lambda d: d.find_element(By.ID, "painter").get_attribute("data-ready") == "1")
        # Image to image has no mask: the painter's tools and canvas stay hidden.
        for hidden in ("mask-tools", "mask-canvas"):
            if driver.find_element(By.ID, hidden).is_displayed():
                fail("%s is shown in image-to-image mode" % hidden)
        fill("prompt", "img2img from the page")
        fill("steps", "4")
        driver.find_element(By.ID, "generate").click()
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".job[data-state='done']")) == 2)
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#gallery figure")) == 2)
        if "[img2img, strength 0.6]" not in driver.find_element(By.CSS_SELECTOR, "#gallery figcaption").text:
            fail("img2img caption: %r" % driver.find_element(By.CSS_SELECTOR, "#gallery figcaption").text)
        shot("2-img2img-done")

        # 5. Inpainting: scripted strokes (brush, a second stroke undone, eraser) at known image
        # pixels; the mask the page sends equals the mask computed here, pixel for pixel.
        driver.find_element(By.CSS_SELECTOR, "input[name=mode][value=inpaint]").click()
        canvas = driver.find_element(By.ID, "mask-canvas")
        fill("brush-size", "10")
        expected = [[0] * 64 for _ in range(64)]
        script_stroke(driver, canvas, [(10, 12), (40, 20), (50, 50)])
        disc_mask(expected, [(10, 12), (40, 20), (50, 50)], 5, 1)
        script_stroke(driver, canvas, [(5, 60), (60, 60)])  # undone below
        driver.find_element(By.ID, "mask-undo").click()
        driver.find_element(By.CSS_SELECTOR, "input[name=tool][value=eraser]").click()
        fill("brush-size", "4")
        script_stroke(driver, canvas, [(25, 16), (30, 18)])
        disc_mask(expected, [(25, 16), (30, 18)], 2, 0)
        with open(os.path.join(args.out, "mask_expected.png"), "wb") as f:
            f.write(png_gray(expected))
        # Capture the form the page posts, then let it through.
        driver.execute_script("""
          const orig = window.fetch; window.__mask = null;
          window.fetch = async (url, opts) => {
            if (url === "/v1/jobs" && opts && opts.body instanceof FormData && opts.body.get("mask")) {
              const b = new Uint8Array(await opts.body.get("mask").arrayBuffer());
              let s = ""; for (const x of b) s += String.fromCharCode(x);
              window.__mask = btoa(s);
            }
            return orig(url, opts);
          };""")
        shot("3-inpaint-mask")
        fill("prompt", "inpainting from the page")
        driver.find_element(By.ID, "generate").click()
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".job[data-state='done']")) == 3)
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#gallery figure")) == 3)
        import base64
        sent = base64.b64decode(driver.execute_script("return window.__mask"))
        with open(os.path.join(args.out, "mask_sent.png"), "wb") as f:
            f.write(sent)
        w, h, rows = png_decode(sent)
        if (w, h) != (64, 64):
            fail("mask size %dx%d" % (w, h))
        bad = [(x, y) for y in range(64) for x in range(64)
               if rows[y][x] != (255 if expected[y][x] else 0)]
        if bad:
            fail("mask differs from the expected mask at %d pixels, first %r" % (len(bad), bad[:5]))
        painted = sum(map(sum, expected))
        if "[inpaint, strength 1]" not in driver.find_element(By.CSS_SELECTOR, "#gallery figcaption").text:
            fail("inpaint caption: %r" % driver.find_element(By.CSS_SELECTOR, "#gallery figcaption").text)
        shot("4-inpaint-done")

        # 6. History survives a reload; delete sticks; Ctrl+Enter generates.
        driver.refresh()
        wait.until(lambda d: d.find_element(By.ID, "gallery").get_attribute("data-loaded") == "3")
        if len(driver.find_elements(By.CSS_SELECTOR, "#gallery figure")) != 3:
            fail("history lost on reload")
        wait.until(lambda d: "z-image-turbo" in d.find_element(By.ID, "server-status").text)
        shot("5-history-after-reload")
        driver.find_elements(By.CSS_SELECTOR, "#gallery button.delete")[-1].click()
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#gallery figure")) == 2)
        driver.refresh()
        wait.until(lambda d: d.find_element(By.ID, "gallery").get_attribute("data-loaded") == "2")
        wait.until(lambda d: "z-image-turbo" in d.find_element(By.ID, "server-status").text)
        from selenium.webdriver.common.keys import Keys
        fill("prompt", "keyboard")
        fill("steps", "2")
        driver.find_element(By.ID, "prompt").send_keys(Keys.CONTROL, Keys.ENTER)
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".job[data-state='done']"))

        # 7. Phone width: nothing wider than the screen; no external URL anywhere in the page.
        driver.set_window_size(390, 844)
        time.sleep(0.3)
        width = driver.execute_script("return document.documentElement.scrollWidth")
        inner = driver.execute_script("return window.innerWidth")
        if width > inner:
            fail("the page is %d px wide at a %d px window" % (width, inner))
        shot("6-phone-width")
        driver.set_window_size(1280, 1000)
        html = driver.execute_script("return document.documentElement.outerHTML")
        if re.search(r"(src|href)=\"(https?:)?//", html) or "https://" in html:
            fail("the page refers to an external URL")

        # 8. Cancel a long job from its card once it is running.
        driver.find_element(By.CSS_SELECTOR, "input[name=mode][value=txt2img]").click()
        fill("prompt", "a very long job")
        fill("steps", "1000")
        fill("width", "128")
        fill("height", "128")
        driver.find_element(By.ID, "generate").click()
        wait.until(lambda d: d.find_elements(
            By.CSS_SELECTOR, ".job:not([data-state]) .status"))
        card = driver.find_element(By.CSS_SELECTOR, ".job:not([data-state])")
        long_id = card.get_attribute("data-id")
        wait.until(lambda d: "step " in card.find_element(By.CLASS_NAME, "status").text
                   and not card.find_element(By.CLASS_NAME, "status").text.startswith("step 0 "))
        card.find_element(By.CLASS_NAME, "cancel").click()
        wait.until(lambda d: card.get_attribute("data-state") == "cancelled")
        shot("7-cancelled")
        status = api(port, "/v1/jobs/" + long_id)
        if status["status"] != "cancelled" or status["step"] >= 1000:
            fail("long job not cancelled: %r" % status)
        print("ServeWebPage: OK (error shown, progress 100 %%, preview before image, reuse, img2img, "
              "inpaint mask equal (%d painted pixels), history after reload, delete, Ctrl+Enter, "
              "phone width, cancel at step %d) in %.1f s; screenshots in %s"
              % (painted, status["step"], time.time() - t_start, args.out))
    finally:
        if driver is not None:
            driver.quit()
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            fail("zimage serve did not stop on SIGTERM")
        if code != 0:
            fail("zimage serve exited with %d after SIGTERM" % code)


if __name__ == "__main__":
    main()
