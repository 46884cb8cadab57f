"""Drive Cirro's web console in a real headless Chromium (Debian's chromium
and chromium-driver, through Selenium): refuse a wrong password, log in, see
the nodes, watch a long statement another client runs, cancel it from the
page, and find it among the ended statements with its plan.

usage: console_browser.py BASE_URL USER PASSWORD MARKER SCREENSHOT_DIR

MARKER is text of the long statement's query (a comment in it). Prints "ok"
when every step passed; screenshots go to SCREENSHOT_DIR.
"""

import os
import sys
import time
import urllib.error
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

base, user, password, marker, shots = sys.argv[1:6]
os.makedirs(shots, exist_ok=True)

options = webdriver.ChromeOptions()
options.binary_location = "/usr/bin/chromium"
for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--window-size=1400,1000"):
    options.add_argument(flag)
driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
# The page redraws its tables at every refresh: an element found before a
# redraw is stale after it, and a wait tries again.
wait = WebDriverWait(driver, 30, poll_frequency=0.2,
                     ignored_exceptions=(StaleElementReferenceException,))


def click(css):
    """Click the element `css` selects, found again if the page redrew it
    between the finding and the click."""
    wait.until(lambda d: d.find_element(By.CSS_SELECTOR, css).click() or True)


def shot(name):
    driver.save_screenshot(os.path.join(shots, name + ".png"))


def step(text):
    print(text, flush=True)


try:
    # Without a login, the console sends the browser to the login page.
    driver.get(base + "/")
    wait.until(EC.url_contains("/login"))
    assert driver.find_element(By.ID, "password"), "no login form"
    step("redirected to /login")

    # A wrong password: refused, still the login page, no data.
    driver.find_element(By.ID, "user").send_keys(user)
    driver.find_element(By.ID, "password").send_keys("not-the-password")
    driver.find_element(By.ID, "submit").click()
    wait.until(EC.text_to_be_present_in_element((By.ID, "message"), "password authentication failed"))
    assert "/login" in driver.current_url, driver.current_url
    assert not driver.find_elements(By.ID, "nodes"), "data shown after a wrong password"
    # The API agrees: the browser holds no session.
    api = driver.execute_script(
        "return fetch('/api/queries').then(r => r.status)")
    assert api == 401, api
    shot("1-login-refused")
    step("wrong password refused")

    # The right password: the console, with this node in the cluster map.
    driver.find_element(By.ID, "user").clear()
    driver.find_element(By.ID, "user").send_keys(user)
    driver.find_element(By.ID, "password").send_keys(password)
    driver.find_element(By.ID, "submit").click()
    wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "#nodes tbody tr")))
    node = driver.find_element(By.CSS_SELECTOR, "#nodes tbody tr")
    assert "this node" in node.text and "running" in node.text, node.text
    step("logged in; nodes: " + node.text)

    # The long statement appears among the live ones, running.
    def live_row(d):
        for row in d.find_elements(By.CSS_SELECTOR, "#live tbody tr"):
            if marker in row.text and row.get_attribute("data-state") == "running":
                return row
        return False
    row = wait.until(live_row)
    query_id = row.get_attribute("data-id")
    # The plots have drawn some history by now.
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#plot-queries polyline.running"))
    shot("2-running")
    step("watching statement " + query_id + ": " + row.text)

    # Cancel it from the page.
    click("button.cancel[data-id='%s']" % query_id)
    wait.until(EC.text_to_be_present_in_element((By.ID, "action"), "Cancelled statement " + query_id))
    wait.until(lambda d: not d.find_elements(By.CSS_SELECTOR, "#live tbody tr[data-id='%s']" % query_id))
    step("cancelled from the page")

    # It is among the ended statements, cancelled; its detail has the plan.
    wait.until(EC.presence_of_element_located(
        (By.CSS_SELECTOR, "#finished tbody tr[data-id='%s']" % query_id)))
    wait.until(lambda d: d.find_element(
        By.CSS_SELECTOR, "#finished tbody tr[data-id='%s']" % query_id).get_attribute("data-state") == "cancelled")
    click("#finished tbody tr[data-id='%s']" % query_id)
    wait.until(EC.text_to_be_present_in_element((By.ID, "detail-plan"), "Exec"))
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#tables tbody tr"))
    shot("3-cancelled")
    step("ended: " + driver.find_element(By.ID, "detail-id").text)

    # Log out: the console is closed again.
    driver.find_element(By.ID, "logout").click()
    wait.until(EC.url_contains("/login"))
    driver.get(base + "/")
    wait.until(EC.url_contains("/login"))
    step("logged out")
    print("ok", query_id)
except Exception:
    shot("failure")
    print(driver.page_source[:4000])
    raise
finally:
    driver.quit()
