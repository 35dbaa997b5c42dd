"""A real headless Chromium (Debian's `chromium` + `chromium-driver`) driven by Selenium, with
every call run in a thread: the tests' loopback targets live on the test's event loop, which a
blocking WebDriver call would otherwise stall."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from tests.harness.waits import wait_until

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None or DRIVER is None,
    reason="needs Debian's chromium and chromium-driver (apt-get install chromium "
    "chromium-driver; .ci/run installs them)",
)
# No network on this machine: nothing Chromium would fetch for itself may be tried.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--no-first-run",
)


ELEMENT_WAIT_S = 20


class Browser:
    def __init__(self, base_url: str, profile: Path, shots: Path):
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service

        options = Options()
        options.binary_location = str(CHROMIUM)
        for flag in (*FLAGS, f"--user-data-dir={profile}", "--window-size=1280,1000"):
            options.add_argument(flag)
        # the driver is given, so Selenium Manager never looks for (or downloads) one
        self.driver = webdriver.Chrome(
            service=Service(executable_path=str(DRIVER)), options=options
        )
        self.driver.set_page_load_timeout(30)
        self.base_url = base_url
        self.shots = shots
        shots.mkdir(parents=True, exist_ok=True)

    async def call(self, fn: Any, *args: Any) -> Any:
        return await asyncio.to_thread(fn, *args)

    async def get(self, path: str) -> None:
        await self.call(self.driver.get, self.base_url + path)

    async def find(self, css: str) -> Any:
        from selenium.webdriver.common.by import By

        return await self.call(self._present, By.CSS_SELECTOR, css)

    def _present(self, by: str, what: str) -> Any:
        """The element, waiting (with a deadline) for the page a click or a submit started
        loading: a lookup right after a navigation must not race it."""
        from selenium.webdriver.support import expected_conditions
        from selenium.webdriver.support.ui import WebDriverWait

        wait = WebDriverWait(self.driver, ELEMENT_WAIT_S)
        return wait.until(expected_conditions.presence_of_element_located((by, what)))

    async def finds(self, css: str) -> list[Any]:
        from selenium.webdriver.common.by import By

        return await self.call(self.driver.find_elements, By.CSS_SELECTOR, css)

    async def link(self, text: str) -> Any:
        from selenium.webdriver.common.by import By

        return await self.call(self._present, By.LINK_TEXT, text)

    async def click(self, element: Any) -> None:
        await self.call(element.click)

    async def text(self, css: str) -> str:
        return str(await self.call(self._text_of, css))

    def _text_of(self, css: str) -> str:
        """The element's text; found again if the page a click started replaced it between
        the lookup and the read (a stale element), until the deadline."""
        from selenium.common.exceptions import StaleElementReferenceException

        for _ in range(ELEMENT_WAIT_S * 10):
            try:
                return str(self._present("css selector", css).text)
            except StaleElementReferenceException:
                time.sleep(0.1)  # a worker thread (`call`): the page is loading
        return str(self._present("css selector", css).text)

    async def page_text(self) -> str:
        return await self.text("body")

    async def wait_for_text(self, fragment: str) -> None:
        """Until the page's text holds `fragment`: after a click that submits a form or follows
        a link, the body read at once may still be the old page's."""
        shown = ""

        async def on_the_page() -> bool:
            nonlocal shown
            shown = await self.page_text()
            return fragment in shown

        try:
            await wait_until(on_the_page, ELEMENT_WAIT_S, 0.05, repr(fragment))
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the page reads: {shown}") from None

    async def path(self) -> str:
        url = await self.call(lambda: self.driver.current_url)
        return str(url)[len(self.base_url) :]

    async def wait_for_path(self, prefix: str) -> None:
        """Until the browser is on a page whose path starts with `prefix` (a link followed),
        loaded."""

        async def arrived() -> bool:
            if not (await self.path()).startswith(prefix):
                return False
            return bool(await self.script("return document.readyState === 'complete'"))

        await wait_until(arrived, ELEMENT_WAIT_S, 0.05, f"a page under {prefix}")

    async def script(self, source: str, *args: Any) -> Any:
        return await self.call(self.driver.execute_script, source, *args)

    async def async_script(self, source: str, *args: Any) -> Any:
        return await self.call(self.driver.execute_async_script, source, *args)

    async def type_into(self, css: str, text: str) -> None:
        element = await self.find(css)
        await self.call(element.clear)
        await self.call(element.send_keys, text)

    async def screenshot(self, name: str, also: Path | None = None) -> Path:
        path = self.shots / f"{name}.png"
        await self.call(self.driver.save_screenshot, str(path))
        if also is not None:
            also.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, also)
        return path

    async def resize(self, width: int, height: int) -> None:
        await self.call(self.driver.set_window_size, width, height)

    async def sign_in(self, token: str) -> None:
        await self.get("/console/")
        assert (await self.path()).startswith("/console/login"), await self.path()
        await self.type_into("#token", token)
        await self.click(await self.find("form button[type=submit]"))

        # a page asked for before the sign-in's redirect lands would race it (and, under
        # load, open without the session cookie): wait until the browser has left the form
        async def left_the_form() -> bool:
            return not (await self.path()).startswith("/console/login")

        await wait_until(left_the_form, ELEMENT_WAIT_S, 0.05, "the sign-in's redirect")

    async def axe(self, impacts: tuple[str, ...] = ("serious", "critical")) -> list[str]:
        """The accessibility linter (axe-core, from the axe-selenium-python wheel: no network)
        run on the page shown: its violations of these impacts, one line each (rule, impact,
        the first offending elements)."""
        from axe_selenium_python import Axe

        checker = Axe(self.driver)
        await self.call(checker.inject)  # WebDriver's scripts are not bound by the page's CSP
        # The wheel's axe-core (3.1) still runs two rules that axe-core itself retired later
        # (3.5: no WCAG criterion asks that every checkbox or radio of one name share a
        # fieldset); the list's row boxes each have their own label, and the bulk bar's radios
        # sit in a labelled radiogroup inside the bar's fieldset.
        retired = {"checkboxgroup": {"enabled": False}, "radiogroup": {"enabled": False}}
        results = await self.call(checker.run, None, json.dumps({"rules": retired}))
        assert len(results["passes"]) > 10, results  # it ran its rules on this page
        return [
            f"{v['id']} ({v['impact']}): {[n['target'] for n in v['nodes'][:3]]} {v['help']}"
            for v in results["violations"]
            if v["impact"] in impacts
        ]

    async def color_scheme(self, scheme: str) -> None:
        """Emulate the system's light or dark preference (prefers-color-scheme)."""
        features = [{"name": "prefers-color-scheme", "value": scheme}]
        await self.call(
            self.driver.execute_cdp_cmd, "Emulation.setEmulatedMedia", {"features": features}
        )

    def close(self) -> None:
        self.driver.quit()
