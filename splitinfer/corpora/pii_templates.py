"""Synthetic privacy-sensitive documents with exact, labelled PII spans.

Documents are rendered from templates written for this project (clinical
notes, e-mails, customer-support chats, legal agreements, financial
statements). Values come from Faker and from faker-healthcare-provider's
``HealthcareProvider``, which supplies correlated diseases, ICD-10 codes,
symptoms and dosed medication orders, so no fallback word lists are needed.

A template is a ``str.format``-style string whose fields read
``{key:kind}``: ``kind`` picks the value generator (see ``_KINDS``) and
``key`` names the value inside one document, so ``{patient:person}`` followed
later by a bare ``{patient}`` repeats the same name. The text is built by
concatenating literal pieces and values while recording the character offset
of every inserted PII value, so ``text[start:end] == value`` holds by
construction.

Held-out evaluation: templates come in two variant sets. Set ``A`` with
locales ``en_US`` / ``en_GB`` is used for the train and val splits; set ``B``
with locales ``en_CA`` / ``en_AU`` only for the test split, and test documents
are seeded from a different seed namespace (fresh identities). Faker's
en_CA / en_AU providers fall back to en_US data for some fields (e.g. person
names), so an individual name may still recur by chance; phone numbers,
addresses, IDs and dates follow the held-out locale's formats where Faker
provides them.
"""

from __future__ import annotations

import functools
import hashlib
import random
import string
from dataclasses import dataclass
from datetime import date
from typing import Any, Callable

from splitinfer.corpora.registry import CorpusError

SPAN_TYPES: tuple[str, ...] = (
    "person", "email", "phone", "address", "ssn", "credit_card", "iban",
    "date_of_birth", "diagnosis", "medication",
)
TRAIN_LOCALES: tuple[str, ...] = ("en_US", "en_GB")
HELD_OUT_LOCALES: tuple[str, ...] = ("en_CA", "en_AU")
TRAIN_SET, HELD_OUT_SET = "A", "B"

_DATE_FORMATS = {"en_US": "%m/%d/%Y", "en_GB": "%d/%m/%Y", "en_CA": "%Y-%m-%d", "en_AU": "%d/%m/%Y"}
_CURRENCY = {"en_US": "$", "en_GB": "£", "en_CA": "CA$", "en_AU": "A$"}


@dataclass(frozen=True)
class PiiTemplate:
    """One document template: ``doc_type`` (genre of text), ``variant_set`` (A or B), ``body``."""

    doc_type: str
    variant_set: str
    body: str

    @property
    def name(self) -> str:
        """Stable template id, e.g. ``clinical_note/A``."""
        return f"{self.doc_type}/{self.variant_set}"


# ----------------------------------------------------------------------------
# Value generators. Each takes (faker, per-document state, locale) -> str.
# ----------------------------------------------------------------------------


def _disease(fake: Any, state: dict[str, Any]) -> str:
    """The document's one disease, drawn on first use so symptoms, codes and drugs agree."""
    if "disease" not in state:
        state["disease"] = fake.disease()
    return state["disease"]


def _fmt_date(value: date, locale: str) -> str:
    return value.strftime(_DATE_FORMATS.get(locale, "%Y-%m-%d"))


def _medication(fake: Any, state: dict[str, Any], locale: str) -> str:
    try:
        order = fake.medication_order(_disease(fake, state))
    except ValueError:  # the disease prescribes no drug: any dosed drug will do
        order = fake.medication_order()
    if order.get("dose") is None:
        state["dose"] = "as directed"
    else:
        state["dose"] = f"{order['dose']} {order['unit']} {str(order['route']).lower()}, {str(order['frequency']).lower()}"
    return str(order["medication"])


def _amount(fake: Any, state: dict[str, Any], locale: str) -> str:
    cents = fake.random_int(500, 950_000)
    return f"{_CURRENCY.get(locale, '$')}{cents / 100:,.2f}"


_Gen = Callable[[Any, dict, str], str]
# kind -> (generator, PII span type or None for non-sensitive filler)
_KINDS: dict[str, tuple[_Gen, str | None]] = {
    "person": (lambda f, s, l: f.name(), "person"),
    "last_name": (lambda f, s, l: f.last_name(), "person"),
    "email": (lambda f, s, l: f.email(), "email"),
    "phone": (lambda f, s, l: f.phone_number(), "phone"),
    "address": (lambda f, s, l: ", ".join(p.strip() for p in f.address().splitlines() if p.strip()), "address"),
    "ssn": (lambda f, s, l: f.ssn(), "ssn"),
    "credit_card": (lambda f, s, l: f.credit_card_number(), "credit_card"),
    "iban": (lambda f, s, l: f.iban(), "iban"),
    "dob": (lambda f, s, l: _fmt_date(f.date_between_dates(date(1935, 1, 1), date(2006, 12, 31)), l), "date_of_birth"),
    "dob_long": (lambda f, s, l: f.date_between_dates(date(1935, 1, 1), date(2006, 12, 31)).strftime("%d %B %Y"), "date_of_birth"),
    "diagnosis": (lambda f, s, l: _disease(f, s), "diagnosis"),
    "medication": (_medication, "medication"),
    # non-sensitive filler
    "icd10": (lambda f, s, l: f.icd10_code(disease=_disease(f, s)), None),
    "symptom": (lambda f, s, l: f.symptom(disease=_disease(f, s)).lower(), None),
    "dose": (lambda f, s, l: s.get("dose", "as directed"), None),
    "date": (lambda f, s, l: _fmt_date(f.date_between_dates(date(2022, 1, 1), date(2025, 12, 31)), l), None),
    "company": (lambda f, s, l: f.company(), None),
    "amount": (_amount, None),
    "ticket": (lambda f, s, l: f"{f.random_uppercase_letter()}{f.random_uppercase_letter()}-{f.random_int(100000, 999999)}", None),
    "small_int": (lambda f, s, l: str(f.random_int(2, 12)), None),
}

# ----------------------------------------------------------------------------
# Templates. Set A: train/val only. Set B: test only (held-out wording/layout).
# ----------------------------------------------------------------------------

_A = TRAIN_SET
_B = HELD_OUT_SET
TEMPLATES: tuple[PiiTemplate, ...] = (
    PiiTemplate("clinical_note", _A, """CLINICAL NOTE
Patient: {patient:person}
DOB: {dob:dob}
SSN: {ssn:ssn}
Address: {addr:address}
Phone: {phone:phone}
Visit date: {visit:date}
Attending: Dr. {doctor:last_name}

History: {patient} presented with {sym:symptom}. Assessment consistent with {dx:diagnosis} ({code:icd10}).
Plan: start {med:medication}, {dose:dose}. Follow up in {weeks:small_int} weeks. Results will be sent to {email:email}.
"""),
    PiiTemplate("email", _A, """From: {sender:person} <{sender_email:email}>
To: {recipient:person}
Date: {sent:date}
Subject: Updated contact details

Hi {recipient},

Please update my records: I have moved to {addr:address} and my new mobile number is {phone:phone}. For the payroll form you also asked for my date of birth ({dob:dob}) and social security number, {ssn:ssn}.

The reimbursement of {amt:amount} can go to my account {iban:iban}.

Thanks,
{sender}
"""),
    PiiTemplate("support_chat", _A, """[Support chat {ticket:ticket}]
Agent: Thank you for contacting {company:company}. May I have your full name?
Customer: {customer:person}
Agent: Thanks. Could you confirm the email address on the account?
Customer: sure, it's {email:email}
Agent: And the card you used for the order?
Customer: {card:credit_card}
Agent: I see a charge of {amt:amount} on {when:date}. I'll text the refund confirmation to {phone:phone}.
Customer: Great. Also my shipping address is wrong, it should be {addr:address}.
Agent: Updated. Is there anything else?
Customer: No, thank you.
"""),
    PiiTemplate("legal_agreement", _A, """RESIDENTIAL LEASE AGREEMENT

This Lease Agreement is made on {signed:date} between {landlord:person} ("Landlord"), of {landlord_addr:address}, and {tenant:person} ("Tenant"), born {dob:dob}, holder of identification number {ssn:ssn}.

1. Premises. The Landlord leases to the Tenant the premises at {premises:address}.
2. Rent. The Tenant shall pay {rent:amount} per month by transfer to IBAN {iban:iban}.
3. Notices. Notices to the Tenant shall be sent to {email:email} or by telephone to {phone:phone}.

Signed: {landlord}, {tenant}
"""),
    PiiTemplate("financial_statement", _A, """MONTHLY ACCOUNT STATEMENT - {bank:company}
Account holder: {holder:person}
Mailing address: {addr:address}
Statement date: {stmt:date}
IBAN: {iban:iban}
Card on file: {card:credit_card}

Opening balance: {open:amount}
Transfer to {payee:person}: {p1:amount}
Card purchase, {store:company}: {p2:amount}
Closing balance: {close:amount}

Questions? Call {phone:phone} or write to {email:email}.
"""),
    PiiTemplate("clinical_note", _B, """Discharge summary for {patient:person} (born {dob:dob_long}; national ID {ssn:ssn}).
The patient, who lives at {addr:address}, was admitted on {adm:date} under the care of Dr. {doctor:last_name} with {sym:symptom}.
Final diagnosis: {dx:diagnosis}, ICD-10 {code:icd10}.
Discharge medication: {med:medication}, {dose:dose}.
Next of kin {kin:person} can be reached on {kin_phone:phone}; follow-up letters go to {email:email}.
"""),
    PiiTemplate("email", _B, """Subject: Re: your pharmacy order

Dear {customer:person},

Your prescription for {med:medication} ({dose:dose}), issued for {dx:diagnosis}, is ready. We will deliver it to {addr:address} on {when:date}, and {amt:amount} will be charged to card {card:credit_card}.
If anything is wrong, reply to {email:email} or call us on {phone:phone}. Please have your date of birth ({dob:dob}) ready for verification.

Kind regards,
{pharmacist:person}
{pharmacy:company} Pharmacy
"""),
    PiiTemplate("support_chat", _B, """Transcript {ticket:ticket} - {company:company} helpline
> bot: Welcome back. Please type your name.
> user: {customer:person}
> bot: To verify your identity, enter your date of birth.
> user: {dob:dob}
> bot: Thanks. Which account is this about?
> user: the one with IBAN {iban:iban}, also pls change my phone to {phone:phone}
> bot: Done. A new card will be posted to {addr:address}. Your old card {card:credit_card} is now blocked.
> user: send the receipt to {email:email}
"""),
    PiiTemplate("legal_agreement", _B, """POWER OF ATTORNEY

I, {grantor:person}, date of birth {dob:dob_long}, identification number {ssn:ssn}, residing at {addr:address}, appoint {agent:person} of {agent_addr:address} as my attorney-in-fact, effective {eff:date}.
My attorney may operate my bank account {iban:iban} and make medical decisions on my behalf, including consent to treatment for {dx:diagnosis}.
Witnessed by {witness:person}, telephone {phone:phone}, email {email:email}.
"""),
    PiiTemplate("financial_statement", _B, """Loan application {ticket:ticket}
Applicant name ........ {applicant:person}
Date of birth ......... {dob:dob}
Tax / social number ... {ssn:ssn}
Home address .......... {addr:address}
Contact ............... {phone:phone} / {email:email}
Requested amount ...... {amt:amount}
Repayment account ..... {iban:iban}
Card for fees ......... {card:credit_card}
Employer .............. {employer:company}
Declared ongoing medication: {med:medication}
"""),
)

_FORMATTER = string.Formatter()


def render_template(template: PiiTemplate, fake: Any, locale: str) -> tuple[str, list[dict[str, Any]]]:
    """Render ``template`` with values from ``fake``; return ``(text, pii_spans)``.

    Spans are ``{"start", "end", "type"}`` character offsets recorded while
    the text is concatenated, so ``text[start:end]`` is exactly the value.
    """
    pieces: list[str] = []
    spans: list[dict[str, Any]] = []
    values: dict[str, str] = {}
    kinds: dict[str, str] = {}
    state: dict[str, Any] = {}
    pos = 0
    for literal, key, spec, _conversion in _FORMATTER.parse(template.body):
        pieces.append(literal)
        pos += len(literal)
        if key is None:
            continue
        kind = spec or kinds.get(key, key)
        if kinds.setdefault(key, kind) != kind:
            raise CorpusError(f"template {template.name!r}: field {key!r} used as both {kinds[key]!r} and {kind!r}; give it one kind")
        if kind not in _KINDS:
            raise CorpusError(f"template {template.name!r}: unknown value kind {kind!r}; use one of {sorted(_KINDS)}")
        generate, span_type = _KINDS[kind]
        if key not in values:
            values[key] = generate(fake, state, locale)
        value = values[key]
        if span_type is not None:
            spans.append({"start": pos, "end": pos + len(value), "type": span_type})
        pieces.append(value)
        pos += len(value)
    return "".join(pieces), spans


@functools.lru_cache(maxsize=None)
def _faker(locale: str) -> Any:
    """One Faker per locale with the healthcare provider; reseeded per document."""
    from faker import Faker
    from faker_healthcare import HealthcareProvider

    fake = Faker(locale)
    fake.add_provider(HealthcareProvider)
    return fake


def _doc_seed(corpus_seed: int, namespace: str, doc_id: str) -> int:
    digest = hashlib.sha256(f"{corpus_seed}|{namespace}|{doc_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def generate_pii_document(doc_id: str, corpus_seed: int, held_out: bool) -> dict[str, Any]:
    """Generate one synthetic document, deterministic in ``(doc_id, corpus_seed, held_out)``.

    ``held_out=False`` draws from template set A and the training locales;
    ``held_out=True`` from set B, the held-out locales and a separate seed
    namespace. Returns ``text``, ``pii_spans``, ``template``,
    ``template_set``, ``doc_type`` and ``locale``.
    """
    variant = HELD_OUT_SET if held_out else TRAIN_SET
    locales = HELD_OUT_LOCALES if held_out else TRAIN_LOCALES
    seed = _doc_seed(corpus_seed, "test" if held_out else "trainval", doc_id)
    rng = random.Random(seed)
    locale = rng.choice(locales)
    template = rng.choice([t for t in TEMPLATES if t.variant_set == variant])
    fake = _faker(locale)
    fake.seed_instance(seed)
    text, spans = render_template(template, fake, locale)
    return {
        "text": text,
        "pii_spans": spans,
        "template": template.name,
        "template_set": variant,
        "doc_type": template.doc_type,
        "locale": locale,
    }
