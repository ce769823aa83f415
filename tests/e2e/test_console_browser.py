"""The operator console in a real headless Chromium, over a real sidecar and fake Stripe.

The agent's refund needs approval; an operator logs in, approves it on the page, and the
agent's re-sent request goes through (the remote gets exactly one refund). A lost reply leaves
an effect ambiguous; the operator settles it on the page with a note. The receipts and freeze
pages render; a freeze on the page stops the agent. A forged POST (another origin's form in the
same browser, and plain HTTP with the session cookie) is refused and changes nothing. Each page
is photographed and the picture checked.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import stripe
from browser_support import (
    chromium,
    foreign_site,
    need_browser,
    screenshot,
    sleep_past_freeze_cache,
    start_console,
    wait_for,
)
from harness import POLICY, Sidecar, clean_env, start_sidecar
from sqlalchemy import select
from stripe_support import ctrlrun_block, outcome, receipts_for, refund, refused, stripe_client

from ctrlrun import ledger
from ctrlrun.schema import events
from ctrlrun.testing import FakeKubernetes, FakeStripe

pytestmark = pytest.mark.timeout(240)
BIG = 150_000  # over the harness policy's 100000: stripe.refund needs approval
TOKEN = "alice-console-token-5b8e1d2c9a"
OPERATORS = "operators:\n  alice: {{token_env: CONSOLE_E2E_ALICE}}\n"


@pytest.fixture
def sidecar(tmp_path: Path) -> Iterator[tuple[Sidecar, FakeStripe]]:
    with FakeStripe() as fake, FakeKubernetes() as kube:
        sc = start_sidecar(
            tmp_path / "sidecar",
            fake,
            kube,
            policy_text=POLICY + OPERATORS,
            reconcile="off",
            in_process=True,
        )
        try:
            yield sc, fake
        finally:
            sc.stop()


def ask(client: stripe.StripeClient, pi: str) -> str:
    err = refused(lambda: refund(client, pi, BIG))
    block = ctrlrun_block(err)
    assert err.http_status == 403 and block["outcome"] == "approval_required"
    return str(block["request_id"])


def approval_status(sc: Sidecar, request_id: str) -> tuple[str, str | None]:
    store = sc.store()
    try:
        with store.reading() as conn:
            row = ledger.approval_row(conn, request_id)
        assert row is not None
        return str(row["status"]), row["approver"]
    finally:
        store.close()


def resolution(sc: Sidecar, key: str) -> dict[str, Any]:
    store = sc.store()
    try:
        with store.reading() as conn:
            rows = conn.execute(
                select(events.c.data_json).where(
                    events.c.effect_key == key, events.c.type == "EFFECT_RESOLVED"
                )
            )
            (found,) = [json.loads(r[0]) for r in rows]
        return dict(found)
    finally:
        store.close()


def log_in(driver: Any, url: str, shots: Path) -> str:
    """Log in as alice; the session's own address (``.../s/PREFIX``), where its pages are."""
    from selenium.webdriver.common.by import By

    driver.get(url + "/approvals")  # no session: sent to the login page
    wait_for(driver, "the login form", lambda d: d.find_elements(By.ID, "login"))
    screenshot(driver, shots, "login", "form#login")
    driver.find_element(By.ID, "operator").send_keys("alice")
    driver.find_element(By.ID, "token").send_keys(TOKEN)
    driver.find_element(By.CSS_SELECTOR, "button.login").click()
    wait_for(driver, "the approvals page", lambda d: d.current_url.endswith("/approvals"))
    home = str(driver.current_url).removesuffix("/approvals")
    assert home.startswith(url + "/s/"), home
    return home


def row_of(driver: Any, table: str, code: str) -> Any:
    from selenium.webdriver.common.by import By

    return wait_for(
        driver,
        f"{code} in #{table}",
        lambda d: d.find_element(By.XPATH, f"//table[@id='{table}']//tr[td/code[text()='{code}']]"),
    )


def flash(driver: Any, text: str) -> None:
    from selenium.webdriver.common.by import By

    wait_for(
        driver,
        f"the message {text!r}",
        lambda d: any(text in m.text for m in d.find_elements(By.CSS_SELECTOR, ".flash")),
    )


def test_an_operator_works_the_console_in_a_browser(
    tmp_path: Path, sidecar: tuple[Sidecar, FakeStripe]
) -> None:
    need_browser()
    from selenium.webdriver.common.by import By

    sc, fake = sidecar
    shots = tmp_path / "shots"
    shots.mkdir()
    env = clean_env(CONSOLE_E2E_ALICE=TOKEN)
    console = start_console(sc.policy, sc.store_url, env, tmp_path / "console.log")
    agent = stripe_client(sc.stripe_base, retries=0)
    try:
        with chromium() as driver:
            # 1. The agent asks; the operator approves on the page; the re-sent refund goes through.
            pi = fake.add_payment_intent(amount=500_000)["id"]
            request_id = ask(agent, pi)
            home = log_in(driver, console.url, shots)
            row = row_of(driver, "approvals", request_id)
            assert pi in row.text and "e2e-agent" in row.text and "stripe.refund" in row.text
            screenshot(driver, shots, "approvals", "table#approvals")
            row.find_element(By.CSS_SELECTOR, "button.approve").click()
            flash(driver, f"granted {request_id} by alice")
            assert approval_status(sc, request_id) == ("granted", "alice")

            done = refund(agent, pi, BIG, headers={"Ctrlrun-Approval": request_id})

            assert done.status == "succeeded" and done.amount == BIG
            assert fake.count("POST", "/v1/refunds") == 1 and len(fake.refunds) == 1
            (receipt,) = [r for r in receipts_for(sc, f"refund:{pi}") if r["result"] == "committed"]
            assert (receipt["approval_id"], receipt["approver"]) == (request_id, "alice")

            # 2. A lost reply: ambiguous; the operator checks the remote and settles it.
            lost_pi = fake.add_payment_intent(amount=5000)["id"]
            key = f"refund:{lost_pi}"
            fake.fail_next("commit_then_drop")
            err = refused(lambda: refund(agent, lost_pi, 1000))
            assert err.http_status == 504 and outcome(err) == "upstream_ambiguous"
            assert sc.effect_state(key) == "ambiguous"
            driver.get(home + "/ambiguous")
            row = row_of(driver, "ambiguous", key)
            (sent,) = [
                ev["request"]["idempotency_key"]
                for ev in fake.events
                if ev["type"] == "refund.created"
                and ev["data"]["object"]["payment_intent"] == lost_pi
            ]
            # The hint names the request to look for at Stripe, by the key Stripe saw.
            assert f"Idempotency-Key {sent}" in row.text
            assert f"GET /v1/refunds?payment_intent={lost_pi}" in row.text
            screenshot(driver, shots, "ambiguous", "table#ambiguous")
            row.find_element(By.CSS_SELECTOR, "button.committed").click()  # no note yet
            assert sc.effect_state(key) == "ambiguous"  # the browser asks for the note first
            note = f"the refund of {lost_pi} is in Stripe's dashboard"
            row = row_of(driver, "ambiguous", key)
            row.find_element(By.TAG_NAME, "textarea").send_keys(note)
            row.find_element(By.CSS_SELECTOR, "button.committed").click()
            flash(driver, f"{key} settled committed by alice")
            assert sc.effect_state(key) == "committed"
            assert resolution(sc, key) | {"note": note} == resolution(sc, key)
            assert resolution(sc, key)["resolver"] == "alice"
            again = refused(lambda: refund(agent, lost_pi, 1000))
            assert again.http_status == 409 and outcome(again) == "duplicate"
            assert fake.count("POST", "/v1/refunds") == 2

            # 3. The receipts, with the chain's status.
            driver.get(home + "/receipts")
            row_of(driver, "receipts", key)
            assert "Chain intact" in driver.find_element(By.ID, "chain").text
            screenshot(driver, shots, "receipts", "table#receipts")

            # 4. The freeze switch stops the agent; lifting it lets the agent on.
            driver.get(home + "/freeze")
            driver.find_element(By.ID, "action").send_keys("stripe.refund")
            driver.find_element(By.ID, "reason").send_keys("refund loop, INC-412")
            driver.find_element(By.CSS_SELECTOR, "button.freeze").click()
            flash(driver, "stripe.refund is frozen by alice: refund loop, INC-412")
            screenshot(driver, shots, "freeze", "table#freezes")
            sleep_past_freeze_cache()
            frozen_pi = fake.add_payment_intent(amount=5000)["id"]
            stopped = refused(lambda: refund(agent, frozen_pi, 1000))
            assert outcome(stopped) == "frozen" and "INC-412" in (stopped.user_message or "")
            assert fake.count("POST", "/v1/refunds") == 2
            driver.find_element(By.XPATH, "//table[@id='freezes']//button").click()
            flash(driver, "unfrozen: stripe.refund by alice")
            sleep_past_freeze_cache()

            # 5. Forged requests: refused, and the approval they aim at stays pending.
            forged_pi = fake.add_payment_intent(amount=500_000)["id"]
            target = ask(agent, forged_pi)  # unfrozen: asked for approval again, not refused
            fields = {"request_id": target, "decision": "approve"}
            with foreign_site(home, fields) as evil:  # even one that knows the prefix
                driver.get(evil)
                driver.find_element(By.ID, "win").click()
                wait_for(driver, "the refusal", lambda d: "Refused" in d.page_source)
            assert approval_status(sc, target) == ("pending", None)
            driver.get(home + "/approvals")
            csrf = driver.find_element(By.NAME, "csrf").get_attribute("value")
            cookie = driver.get_cookie("ctrlrun_console")
            assert cookie and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
            jar = {"ctrlrun_console": cookie["value"]}
            for data, headers in [
                (fields, {}),
                ({**fields, "csrf": "guessed"}, {}),
                ({**fields, "csrf": csrf}, {"Origin": "http://evil.example"}),
            ]:
                got = httpx.post(
                    home + "/approvals/answer",
                    data=data,
                    headers=headers,
                    cookies=jar,
                    timeout=10,
                    trust_env=False,
                )
                assert got.status_code == 403 and "Nothing was changed" in got.text
            assert approval_status(sc, target) == ("pending", None)
            assert fake.count("POST", "/v1/refunds") == 2
    finally:
        assert console.stop() == 0
    logged = (tmp_path / "console.log").read_text()
    assert TOKEN not in logged and cookie["value"] not in logged
