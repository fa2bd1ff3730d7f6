#!/usr/bin/env python3
"""The web page of `zimage serve` in real headless Chromium (selenium + Debian's chromedriver).

Starts `zimage serve --port 0` on the tiny model, then in the browser: an invalid request shows
a clear error; a job's progress bar reaches 100 % and its image appears in the gallery with its
parameters; "reuse settings" fills the form back; a long job is cancelled from its card. Loopback
only. Without chromium/chromedriver/selenium this test FAILS (scripts/setup.sh installs them).

  test_web_page.py --zimage build/cpu/zimage --model build/cpu/golden/v_turbo/model
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
    args = ap.parse_args()

    proc, port = start_server(args.zimage, args.model)
    driver = None
    try:
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import WebDriverWait

        driver = make_driver()
        wait = WebDriverWait(driver, 60)
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

        # 4. Cancel a long job from its card once it is running.
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
        status = api(port, "/v1/jobs/" + long_id)
        if status["status"] != "cancelled" or status["step"] >= 1000:
            fail("long job not cancelled: %r" % status)
        print("ServeWebPage: OK (error shown, progress 100 %%, image 64x64, reuse, cancel at "
              "step %d)" % status["step"])
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
