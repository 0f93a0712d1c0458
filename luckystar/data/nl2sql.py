"""Generated enterprise SQLite databases and bilingual NL2SQL questions with gold SQL.

Four business domains (sales, HR, finance, inventory), each built as five
database *instances* (`INSTANCES`): three for training, one for held-out
evaluation (a database the training split never sees, with its own table and
column names, as Spider splits train and dev databases) and one for the
rejection-sampling teacher (docs/rl.md), again with its own names. Values mix Korean and English text and
include dates and NULLs. Questions come in English and Korean at three
difficulties: single table → joins → aggregates/subqueries. A question quotes its text values as the
query's literal does (`spell`: "customers from 'Daegu'"), so the value has the same tokens in both.

Build the databases (deterministic; a few seconds) with `build_databases(dir)`.
"""

import dataclasses
import os
import pathlib
import random
import sqlite3
import tempfile
from typing import Callable, Iterator

import faker

from luckystar.data.examples import SPLITS, Example, dedupe
from luckystar.tools import sql as sql_tool

VERSION = 2
# instance → (split, naming variant). Three training databases per domain share one schema wording
# with different rows; the held-out and teacher databases each have their own wording and rows.
INSTANCES = {0: ('train', 0), 1: ('train', 0), 2: ('train', 0), 3: ('heldout', 1), 4: ('teacher', 2)}
assert {split for split, _ in INSTANCES.values()} == set(SPLITS)
_TRAIN_VARIANT = next(variant for split, variant in INSTANCES.values() if split == 'train')

KO_CITIES = ('서울', '부산', '인천', '대구', '대전', '광주', '수원', '울산')
EN_CITIES = ('Seoul', 'Busan', 'Incheon', 'Daegu', 'Daejeon', 'Gwangju', 'Suwon', 'Ulsan')


def default_dir() -> pathlib.Path:
  root = os.environ.get('LUCKYSTAR_DATA_DIR') or pathlib.Path.home() / '.cache' / 'luckystar'
  return pathlib.Path(root) / f'nl2sql-v{VERSION}'


# ---- schemas ---------------------------------------------------------------------------------
# Each domain names its tables/columns logically; an instance maps logical → physical names,
# so held-out databases differ in schema wording as well as in data.

_NAMING = {
    'sales': (
        dict(customers='customers', customer='customer_id', orders='orders', products='products',
             items='order_items', product='product_id', order='order_id', city='city', tier='tier',
             joined='signup_date', ordered='order_date', price='price', qty='quantity', category='category'),
        dict(customers='clients', customer='client_id', orders='purchases', products='catalog',
             items='purchase_lines', product='catalog_id', order='purchase_id', city='region', tier='grade',
             joined='joined_on', ordered='purchased_on', price='list_price', qty='units', category='product_type'),
        dict(customers='buyers', customer='buyer_id', orders='sales_orders', products='goods',
             items='sales_lines', product='goods_id', order='sales_order_id', city='location', tier='level',
             joined='registered_at', ordered='ordered_at', price='unit_price', qty='amount', category='kind'),
    ),
    'hr': (
        dict(departments='departments', employees='employees', dept='department_id', salary='salary',
             hired='hire_date', title='title', manager='manager_id', location='location'),
        dict(departments='teams', employees='staff', dept='team_id', salary='annual_pay', hired='joined_on',
             title='job_title', manager='lead_id', location='office'),
        dict(departments='divisions', employees='personnel', dept='division_id', salary='base_salary',
             hired='start_date', title='position', manager='supervisor_id', location='site'),
    ),
    'finance': (
        dict(accounts='accounts', transactions='transactions', account='account_id', owner='owner',
             kind='account_type', branch='branch', amount='amount', day='txn_date', category='category',
             memo='memo'),
        dict(accounts='ledgers', transactions='entries', account='ledger_id', owner='holder', kind='ledger_type',
             branch='office', amount='value', day='posted_on', category='purpose', memo='note'),
        dict(accounts='wallets', transactions='movements', account='wallet_id', owner='client', kind='plan',
             branch='center', amount='sum_krw', day='moved_at', category='label', memo='remark'),
    ),
    'inventory': (
        dict(suppliers='suppliers', items='items', stock='stock', supplier='supplier_id', item='item_id',
             country='country', cost='unit_cost', category='category', warehouse='warehouse', qty='quantity',
             restocked='last_restock'),
        dict(suppliers='vendors', items='parts', stock='inventory_levels', supplier='vendor_id', item='part_id',
             country='origin', cost='cost_krw', category='part_group', warehouse='depot', qty='on_hand',
             restocked='restocked_on'),
        dict(suppliers='makers', items='products', stock='warehouse_stock', supplier='maker_id',
             item='product_id', country='nation', cost='purchase_cost', category='line', warehouse='site',
             qty='count', restocked='refilled_at'),
    ),
}
DOMAINS = tuple(_NAMING)


def db_id(domain: str, instance: int) -> str:
  return f'{domain}_{instance}'


def _date(rng: random.Random, start_year: int = 2019, end_year: int = 2025) -> str:
  return f'{rng.randint(start_year, end_year)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}'


def _person(rng: random.Random, fake_ko: faker.Faker, fake_en: faker.Faker) -> str:
  return fake_ko.name() if rng.random() < 0.6 else fake_en.name()


def _city(rng: random.Random) -> str:
  return rng.choice(KO_CITIES) if rng.random() < 0.6 else rng.choice(EN_CITIES)


def _build_sales(conn, n, rng, fake_ko, fake_en):
  conn.executescript(f"""
    CREATE TABLE {n['customers']} (id INTEGER PRIMARY KEY, name TEXT NOT NULL, {n['city']} TEXT,
                                  {n['tier']} TEXT, {n['joined']} DATE);
    CREATE TABLE {n['products']} (id INTEGER PRIMARY KEY, name TEXT NOT NULL, {n['category']} TEXT,
                                  {n['price']} INTEGER NOT NULL);
    CREATE TABLE {n['orders']} (id INTEGER PRIMARY KEY, {n['customer']} INTEGER REFERENCES {n['customers']}(id),
                                {n['ordered']} DATE NOT NULL, status TEXT);
    CREATE TABLE {n['items']} (id INTEGER PRIMARY KEY, {n['order']} INTEGER REFERENCES {n['orders']}(id),
                               {n['product']} INTEGER REFERENCES {n['products']}(id), {n['qty']} INTEGER NOT NULL);
  """)
  products = (('무선 마우스', '전자기기'), ('USB-C Cable', '전자기기'), ('기계식 키보드', '전자기기'),
              ('Noise-cancelling Headphones', '전자기기'), ('유기농 녹차', '식품'), ('Arabica Coffee Beans', '식품'),
              ('김치 세트', '식품'), ('Olive Oil', '식품'), ('사무용 의자', '가구'), ('Standing Desk', '가구'),
              ('책장', '가구'), ('A4 용지', '사무용품'), ('Gel Pen Set', '사무용품'), ('스테이플러', '사무용품'))
  for i, (name, category) in enumerate(rng.sample(products, 11), 1):
    conn.execute(f'INSERT INTO {n["products"]} VALUES (?, ?, ?, ?)', (i, name, category, rng.randint(2, 300) * 500))
  for i in range(1, 41):
    conn.execute(f'INSERT INTO {n["customers"]} VALUES (?, ?, ?, ?, ?)',
                 (i, _person(rng, fake_ko, fake_en), _city(rng) if rng.random() > 0.1 else None,
                  rng.choice(('gold', 'silver', 'bronze', None)), _date(rng, 2018, 2024)))
  line = 1
  for i in range(1, 121):
    conn.execute(f'INSERT INTO {n["orders"]} VALUES (?, ?, ?, ?)',
                 (i, rng.randint(1, 40), _date(rng, 2022, 2025), rng.choice(('paid', 'shipped', 'cancelled'))))
    for _ in range(rng.randint(1, 3)):
      conn.execute(f'INSERT INTO {n["items"]} VALUES (?, ?, ?, ?)', (line, i, rng.randint(1, 11), rng.randint(1, 5)))
      line += 1


def _build_hr(conn, n, rng, fake_ko, fake_en):
  conn.executescript(f"""
    CREATE TABLE {n['departments']} (id INTEGER PRIMARY KEY, name TEXT NOT NULL, {n['location']} TEXT);
    CREATE TABLE {n['employees']} (id INTEGER PRIMARY KEY, name TEXT NOT NULL,
                                   {n['dept']} INTEGER REFERENCES {n['departments']}(id), {n['title']} TEXT,
                                   {n['salary']} INTEGER, {n['hired']} DATE, {n['manager']} INTEGER);
  """)
  departments = ('영업부', 'Engineering', '인사팀', 'Marketing', '재무팀', 'Customer Support', '연구개발')
  for i, name in enumerate(rng.sample(departments, 5), 1):
    conn.execute(f'INSERT INTO {n["departments"]} VALUES (?, ?, ?)', (i, name, _city(rng)))
  titles = ('사원', '대리', '과장', '부장', 'Engineer', 'Senior Engineer', 'Manager', 'Analyst')
  for i in range(1, 61):
    conn.execute(f'INSERT INTO {n["employees"]} VALUES (?, ?, ?, ?, ?, ?, ?)',
                 (i, _person(rng, fake_ko, fake_en), rng.randint(1, 5), rng.choice(titles),
                  rng.randint(30, 120) * 1_000_000 if rng.random() > 0.05 else None, _date(rng, 2010, 2025),
                  rng.randint(1, i - 1) if i > 3 and rng.random() > 0.2 else None))


def _build_finance(conn, n, rng, fake_ko, fake_en):
  conn.executescript(f"""
    CREATE TABLE {n['accounts']} (id INTEGER PRIMARY KEY, {n['owner']} TEXT NOT NULL, {n['kind']} TEXT,
                                  {n['branch']} TEXT, opened DATE);
    CREATE TABLE {n['transactions']} (id INTEGER PRIMARY KEY,
                                      {n['account']} INTEGER REFERENCES {n['accounts']}(id),
                                      {n['day']} DATE NOT NULL, {n['amount']} INTEGER NOT NULL,
                                      {n['category']} TEXT, {n['memo']} TEXT);
  """)
  for i in range(1, 31):
    conn.execute(f'INSERT INTO {n["accounts"]} VALUES (?, ?, ?, ?, ?)',
                 (i, _person(rng, fake_ko, fake_en), rng.choice(('checking', 'savings', '적금', '외화')),
                  _city(rng), _date(rng, 2015, 2023)))
  categories = ('급여', 'rent', '식비', 'utilities', '교통', 'transfer', '쇼핑')
  for i in range(1, 201):
    amount = rng.randint(1, 500) * 1000 * (1 if rng.random() < 0.3 else -1)
    conn.execute(f'INSERT INTO {n["transactions"]} VALUES (?, ?, ?, ?, ?, ?)',
                 (i, rng.randint(1, 30), _date(rng, 2023, 2025), amount, rng.choice(categories),
                  rng.choice(('월세', 'monthly', '점심', None, None))))


def _build_inventory(conn, n, rng, fake_ko, fake_en):
  conn.executescript(f"""
    CREATE TABLE {n['suppliers']} (id INTEGER PRIMARY KEY, name TEXT NOT NULL, {n['country']} TEXT);
    CREATE TABLE {n['items']} (id INTEGER PRIMARY KEY, name TEXT NOT NULL, {n['category']} TEXT,
                               {n['supplier']} INTEGER REFERENCES {n['suppliers']}(id), {n['cost']} INTEGER);
    CREATE TABLE {n['stock']} (id INTEGER PRIMARY KEY, {n['item']} INTEGER REFERENCES {n['items']}(id),
                               {n['warehouse']} TEXT, {n['qty']} INTEGER NOT NULL, {n['restocked']} DATE);
  """)
  countries = ('대한민국', 'Japan', 'China', 'Vietnam', 'Germany', '미국')
  for i in range(1, 9):
    conn.execute(f'INSERT INTO {n["suppliers"]} VALUES (?, ?, ?)', (i, fake_ko.company() if i % 2 else
                                                                   fake_en.company(), rng.choice(countries)))
  parts = rng.sample((
      ('볼트 M6', '부품'), ('Hex Nut', '부품'), ('베어링', '부품'), ('스프링 와셔', '부품'), ('Steel Hinge', '부품'),
      ('고무 패킹', '부품'), ('Copper Wire', '원자재'), ('알루미늄 판', '원자재'), ('Plastic Pellets', '원자재'),
      ('스테인리스 봉', '원자재'), ('Glass Fiber', '원자재'), ('원목 합판', '원자재'), ('포장 박스', '포장재'),
      ('Bubble Wrap', '포장재'), ('라벨 스티커', '포장재'), ('Stretch Film', '포장재'), ('완충재', '포장재'),
      ('Circuit Board', '전자부품'), ('저항기', '전자부품'), ('Capacitor', '전자부품'), ('LED 모듈', '전자부품'),
      ('Power Adapter', '전자부품'), ('센서 칩', '전자부품'), ('Cooling Fan', '전자부품')), 14)
  for i, (name, category) in enumerate(parts, 1):
    conn.execute(f'INSERT INTO {n["items"]} VALUES (?, ?, ?, ?, ?)',
                 (i, name, category, rng.randint(1, 8), rng.randint(1, 400) * 100))
  warehouses = rng.sample(('평택 센터', 'Incheon Hub', '부산 물류창고', '이천 창고', 'Gimpo DC', '대전 허브', 'Ulsan Yard'), 3)
  row = 1
  for item in range(1, len(parts) + 1):
    for warehouse in rng.sample(warehouses, rng.randint(1, 3)):
      conn.execute(f'INSERT INTO {n["stock"]} VALUES (?, ?, ?, ?, ?)',
                   (row, item, warehouse, rng.randint(0, 900), _date(rng, 2024, 2025) if rng.random() > 0.15
                    else None))
      row += 1


_BUILDERS = {'sales': _build_sales, 'hr': _build_hr, 'finance': _build_finance, 'inventory': _build_inventory}


def names(domain: str, instance: int) -> dict[str, str]:
  return _NAMING[domain][INSTANCES[instance][1]]


def build_database(path: pathlib.Path, domain: str, instance: int | str, seed: int = 0,
                   naming: dict[str, str] | None = None) -> pathlib.Path:
  """Writes one database atomically (temp file + rename); the same arguments give the same rows.
  `naming` (default `names(domain, instance)`) maps the domain's logical names to physical ones."""
  rng = random.Random(f'nl2sql:{seed}:{domain}:{instance}')
  fake_ko, fake_en = faker.Faker('ko_KR'), faker.Faker('en_US')
  fake_ko.seed_instance(rng.getrandbits(32))
  fake_en.seed_instance(rng.getrandbits(32))
  path.parent.mkdir(parents=True, exist_ok=True)
  handle, tmp = tempfile.mkstemp(dir=path.parent, suffix='.sqlite.tmp')
  os.close(handle)
  try:
    with sqlite3.connect(tmp) as conn:
      _BUILDERS[domain](conn, naming or names(domain, instance), rng, fake_ko, fake_en)
    conn.close()
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)
  return path


def _tables(path: pathlib.Path) -> set[str]:
  conn = sqlite3.connect(f'file:{path}?mode=ro', uri=True)
  try:
    return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
  except sqlite3.DatabaseError:
    return set()
  finally:
    conn.close()


_TABLE_KEYS = {'sales': ('customers', 'orders', 'products', 'items'), 'hr': ('departments', 'employees'),
               'finance': ('accounts', 'transactions'), 'inventory': ('suppliers', 'items', 'stock')}


def _expected_tables(domain: str, instance: int) -> set[str]:
  return {names(domain, instance)[key] for key in _TABLE_KEYS[domain]}


def build_databases(directory: str | pathlib.Path | None = None, seed: int = 0) -> dict[str, pathlib.Path]:
  """All domain × instance databases as `<dir>/<db_id>/<db_id>.sqlite` (Spider's layout). Existing
  files are reused when they have the expected tables (bump VERSION when the rows change)."""
  directory = pathlib.Path(directory or default_dir())
  paths = {}
  for domain in DOMAINS:
    for instance in INSTANCES:
      name = db_id(domain, instance)
      path = directory / name / f'{name}.sqlite'
      if not path.is_file() or _tables(path) != _expected_tables(domain, instance):
        build_database(path, domain, instance, seed)
      paths[name] = path
  return paths


# ---- questions -------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Template:
  domain: str
  difficulty: int
  en: str
  ko: str
  sql: str
  values: Callable[[random.Random, sqlite3.Connection, dict], dict] = lambda rng, conn, n: {}


def _pick(conn: sqlite3.Connection, sql: str, rng: random.Random):
  rows = [r[0] for r in conn.execute(sql) if r[0] is not None]
  return rng.choice(sorted(set(rows), key=str)) if rows else None


def _year(rng, conn, n):
  return {'year': rng.randint(2022, 2025)}


TEMPLATES = (
    # sales
    _Template('sales', 1, 'How many customers are in {city}?', '{city}에 있는 고객은 몇 명인가요?',
              "SELECT COUNT(*) FROM {customers} WHERE {city_col} = '{city}'",
              lambda rng, c, n: {'city': _pick(c, f'SELECT {n["city"]} FROM {n["customers"]}', rng)}),
    _Template('sales', 1, 'List the names of products in the {category} category, cheapest first.',
              '{category} 카테고리에 속한 상품의 이름을 가격이 낮은 순서로 보여 주세요.',
              "SELECT name FROM {products} WHERE {category_col} = '{category}' ORDER BY {price} ASC, name",
              lambda rng, c, n: {'category': _pick(c, f'SELECT {n["category"]} FROM {n["products"]}', rng)}),
    _Template('sales', 1, 'How many customers have no tier recorded?', '등급 정보가 없는 고객은 몇 명인가요?',
              'SELECT COUNT(*) FROM {customers} WHERE {tier} IS NULL'),
    _Template('sales', 2, 'How many orders did customers from {city} place in {year}?',
              '{year}년에 {city} 고객이 주문한 건수는 몇 건인가요?',
              "SELECT COUNT(*) FROM {orders} o JOIN {customers} c ON o.{customer} = c.id "
              "WHERE c.{city_col} = '{city}' AND strftime('%Y', o.{ordered}) = '{year}'",
              lambda rng, c, n: {'city': _pick(c, f'SELECT {n["city"]} FROM {n["customers"]}', rng),
                                 **_year(rng, c, n)}),
    _Template('sales', 2, 'Which products did {name} order? List distinct product names.',
              '{name} 고객이 주문한 상품의 이름을 중복 없이 알려 주세요.',
              "SELECT DISTINCT p.name FROM {customers} c JOIN {orders} o ON o.{customer} = c.id "
              "JOIN {items} i ON i.{order} = o.id JOIN {products} p ON p.id = i.{product} WHERE c.name = '{name}'",
              lambda rng, c, n: {'name': _pick(c, f'SELECT name FROM {n["customers"]}', rng)}),
    _Template('sales', 3, 'What is the total revenue (price times quantity) of non-cancelled orders in {year}?',
              '{year}년에 취소되지 않은 주문의 총매출(가격 × 수량)은 얼마인가요?',
              "SELECT SUM(p.{price} * i.{qty}) FROM {items} i JOIN {orders} o ON o.id = i.{order} "
              "JOIN {products} p ON p.id = i.{product} WHERE o.status != 'cancelled' "
              "AND strftime('%Y', o.{ordered}) = '{year}'", _year),
    _Template('sales', 3, 'For each product category, how many units were sold? Order by units, highest first.',
              '상품 카테고리별 판매 수량을 많은 순서대로 보여 주세요.',
              "SELECT p.{category_col}, SUM(i.{qty}) AS units FROM {items} i JOIN {products} p "
              "ON p.id = i.{product} GROUP BY p.{category_col} ORDER BY units DESC"),
    _Template('sales', 3, 'Which customers placed more orders than the average customer?',
              '평균보다 많은 주문을 한 고객의 이름은 무엇인가요?',
              "SELECT c.name FROM {customers} c JOIN {orders} o ON o.{customer} = c.id GROUP BY c.id "
              "HAVING COUNT(*) > (SELECT COUNT(*) * 1.0 / COUNT(DISTINCT {customer}) FROM {orders})"),
    # hr
    _Template('hr', 1, 'How many employees were hired in {year}?', '{year}년에 입사한 직원은 몇 명인가요?',
              "SELECT COUNT(*) FROM {employees} WHERE strftime('%Y', {hired}) = '{year}'",
              lambda rng, c, n: {'year': rng.randint(2010, 2025)}),
    _Template('hr', 1, 'Which employees have no recorded salary?', '급여 정보가 없는 직원은 누구인가요?',
              'SELECT name FROM {employees} WHERE {salary} IS NULL'),
    _Template('hr', 1, 'List the names of employees with the title {title}.',
              '직함이 {title}인 직원의 이름을 알려 주세요.',
              "SELECT name FROM {employees} WHERE {title_col} = '{title}'",
              lambda rng, c, n: {'title': _pick(c, f'SELECT {n["title"]} FROM {n["employees"]}', rng)}),
    _Template('hr', 2, 'How many employees work in the {department} department?',
              '{department} 부서에서 일하는 직원은 몇 명인가요?',
              "SELECT COUNT(*) FROM {employees} e JOIN {departments} d ON e.{dept} = d.id "
              "WHERE d.name = '{department}'",
              lambda rng, c, n: {'department': _pick(c, f'SELECT name FROM {n["departments"]}', rng)}),
    _Template('hr', 2, 'Who is the manager of {name}?', '{name} 직원의 관리자는 누구인가요?',
              "SELECT m.name FROM {employees} e JOIN {employees} m ON e.{manager} = m.id WHERE e.name = '{name}'",
              lambda rng, c, n: {'name': _pick(c, f'SELECT name FROM {n["employees"]} WHERE {n["manager"]} '
                                                  'IS NOT NULL', rng)}),
    _Template('hr', 3, 'What is the average salary in each department? Highest first.',
              '부서별 평균 급여를 높은 순서대로 보여 주세요.',
              'SELECT d.name, AVG(e.{salary}) AS avg_salary FROM {employees} e JOIN {departments} d '
              'ON e.{dept} = d.id GROUP BY d.name ORDER BY avg_salary DESC'),
    _Template('hr', 3, 'Which employees earn more than the average salary of their own department?',
              '자기 부서의 평균 급여보다 많이 받는 직원은 누구인가요?',
              'SELECT e.name FROM {employees} e WHERE e.{salary} > (SELECT AVG(x.{salary}) FROM {employees} x '
              'WHERE x.{dept} = e.{dept})'),
    # finance
    _Template('finance', 1, 'How many {kind} accounts are there?', '{kind} 계좌는 몇 개인가요?',
              "SELECT COUNT(*) FROM {accounts} WHERE {kind_col} = '{kind}'",
              lambda rng, c, n: {'kind': _pick(c, f'SELECT {n["kind"]} FROM {n["accounts"]}', rng)}),
    _Template('finance', 1, 'How many transactions have no memo?', '메모가 없는 거래는 몇 건인가요?',
              'SELECT COUNT(*) FROM {transactions} WHERE {memo} IS NULL'),
    _Template('finance', 2, 'What is the total amount of {category} transactions for accounts at the {branch} '
              'branch?', '{branch} 지점 계좌의 {category} 거래 금액 합계는 얼마인가요?',
              "SELECT SUM(t.{amount}) FROM {transactions} t JOIN {accounts} a ON t.{account} = a.id "
              "WHERE a.{branch_col} = '{branch}' AND t.{category_col} = '{category}'",
              lambda rng, c, n: {'branch': _pick(c, f'SELECT {n["branch"]} FROM {n["accounts"]}', rng),
                                 'category': _pick(c, f'SELECT {n["category"]} FROM {n["transactions"]}', rng)}),
    _Template('finance', 2, 'List the dates and amounts of transactions of {owner}, most recent first.',
              '{owner} 고객의 거래 날짜와 금액을 최근 순서로 보여 주세요.',
              "SELECT t.{day}, t.{amount} FROM {transactions} t JOIN {accounts} a ON t.{account} = a.id "
              "WHERE a.{owner_col} = '{owner}' ORDER BY t.{day} DESC, t.id DESC",
              lambda rng, c, n: {'owner': _pick(c, f'SELECT {n["owner"]} FROM {n["accounts"]}', rng)}),
    _Template('finance', 3, 'What was the net amount per month in {year}? Order by month.',
              '{year}년 월별 순거래 금액을 월 순서대로 보여 주세요.',
              "SELECT strftime('%m', {day}) AS month, SUM({amount}) FROM {transactions} "
              "WHERE strftime('%Y', {day}) = '{year}' GROUP BY month ORDER BY month",
              lambda rng, c, n: {'year': rng.randint(2023, 2025)}),
    _Template('finance', 3, 'Which account owners have a negative total balance across their transactions?',
              '거래 합계가 음수인 계좌의 소유자는 누구인가요?',
              'SELECT a.{owner_col} FROM {accounts} a JOIN {transactions} t ON t.{account} = a.id '
              'GROUP BY a.id HAVING SUM(t.{amount}) < 0'),
    # inventory
    _Template('inventory', 1, 'How many items are in the {category} category?', '{category} 분류의 품목은 몇 개인가요?',
              "SELECT COUNT(*) FROM {items} WHERE {category_col} = '{category}'",
              lambda rng, c, n: {'category': _pick(c, f'SELECT {n["category"]} FROM {n["items"]}', rng)}),
    _Template('inventory', 1, 'Which suppliers are based in {country}?', '{country}에 있는 공급업체는 어디인가요?',
              "SELECT name FROM {suppliers} WHERE {country_col} = '{country}'",
              lambda rng, c, n: {'country': _pick(c, f'SELECT {n["country"]} FROM {n["suppliers"]}', rng)}),
    _Template('inventory', 2, 'Which items are supplied by {supplier}?', '{supplier}에서 공급하는 품목은 무엇인가요?',
              "SELECT i.name FROM {items} i JOIN {suppliers} p ON i.{supplier_col} = p.id WHERE p.name = '{supplier}'",
              lambda rng, c, n: {'supplier': _pick(c, f'SELECT name FROM {n["suppliers"]}', rng)}),
    _Template('inventory', 2, 'What is the total quantity of {item} across all warehouses?',
              '모든 창고에 있는 {item}의 총수량은 얼마인가요?',
              "SELECT SUM(s.{qty}) FROM {stock} s JOIN {items} i ON s.{item_col} = i.id WHERE i.name = '{item}'",
              lambda rng, c, n: {'item': _pick(c, f'SELECT name FROM {n["items"]}', rng)}),
    _Template('inventory', 2, 'Which items stored at {warehouse} have fewer than {qty_limit} units?',
              '{warehouse}에 보관된 품목 중 수량이 {qty_limit}개 미만인 품목은 무엇인가요?',
              "SELECT i.name FROM {stock} s JOIN {items} i ON s.{item_col} = i.id "
              "WHERE s.{warehouse_col} = '{warehouse}' AND s.{qty} < {qty_limit}",
              lambda rng, c, n: {'warehouse': _pick(c, f'SELECT {n["warehouse"]} FROM {n["stock"]}', rng),
                                 'qty_limit': rng.choice((100, 200, 300, 500))}),
    _Template('inventory', 3, 'What is the total stock value (unit cost times quantity) per supplier? '
              'Highest first.', '공급업체별 재고 가치(단가 × 수량)를 높은 순서대로 보여 주세요.',
              'SELECT p.name, SUM(i.{cost} * s.{qty}) AS stock_value FROM {stock} s JOIN {items} i '
              'ON s.{item_col} = i.id JOIN {suppliers} p ON i.{supplier} = p.id GROUP BY p.name '
              'ORDER BY stock_value DESC'),
    _Template('inventory', 3, 'Which items have never been restocked in any warehouse?',
              '어느 창고에서도 재입고 기록이 없는 품목은 무엇인가요?',
              'SELECT name FROM {items} WHERE id NOT IN (SELECT {item_col} FROM {stock} '
              'WHERE {restocked} IS NOT NULL)'),
)


def spell(value) -> str:
  """A template value as a question (and a trace's thinking) writes it: text in single quotes, as in the SQL
  literal, numbers bare. Quoted, a value has the same tokens in the question and in the query (the tokenizer
  has no dummy prefix: `Daegu` after a space and after a quote are different pieces, 62% of the values were
  spelled apart), and the quote marks where a copy starts. The unquoted questions left the tiny teacher
  writing one memorised value whatever the question named (experiments/cold_start.md)."""
  text = str(value)
  return text if text.isdigit() else f"'{text}'"


def _format_names(n: dict[str, str]) -> dict[str, str]:
  """Template placeholders: table names as-is; `<x>_col` for columns whose logical name is also a value slot."""
  return {**n, **{f'{k}_col': v for k, v in n.items()}}


def context(name: str, path: pathlib.Path) -> str:
  """An NL2SQL question's system text: the database's name and schema."""
  return f'SQLite database `{name}`:\n{sql_tool.schema(path)}'


def generate(db_paths: dict[str, pathlib.Path], per_template: int = 30, seed: int = 0) -> Iterator[Example]:
  rng = random.Random(f'nl2sql-questions:{seed}')
  for name, path in sorted(db_paths.items()):
    domain, instance = name.rsplit('_', 1)
    yield from _questions(name, path, domain, names(domain, int(instance)), INSTANCES[int(instance)][0], rng,
                          per_template)


def _questions(name: str, path: pathlib.Path, domain: str, n: dict[str, str], split: str, rng: random.Random,
               per_template: int) -> Iterator[Example]:
  """`per_template` draws of each of the domain's templates over one database, in both languages."""
  system = context(name, path)
  conn = sqlite3.connect(f'file:{path}?mode=ro', uri=True)  # our own database: values for the templates
  try:
    for index, template in enumerate(t for t in TEMPLATES if t.domain == domain):
      for _ in range(per_template):
        values = template.values(rng, conn, n)
        if any(v is None for v in values.values()):
          continue
        sql = template.sql.format_map({**_format_names(n), **values})  # value slots win over names
        for language, text in (('en', template.en), ('ko', template.ko)):
          prompt = text.format(**{key: spell(value) for key, value in values.items()})
          yield Example(
              id=f'nl2sql-{name}-{index}-{language}-{rng.getrandbits(32):08x}', task='nl2sql',
              language=language, split=split, prompt=prompt, answer=sql,
              system=system, difficulty=template.difficulty,
              meta={'db_id': name, 'db_path': str(path), 'template': index,
                    'values': [str(v) for v in values.values()]})
  finally:
    conn.close()


def suite(db_paths: dict[str, pathlib.Path] | None = None, per_template: int = 30, seed: int = 0
          ) -> list[Example]:
  """Questions over all databases. A question text that occurs in several splits (e.g. the same
  parameter-free question over two databases) is kept only in the first of held-out, teacher,
  train, so no two splits share a question."""
  examples = dedupe(generate(db_paths or build_databases(seed=seed), per_template, seed))
  taken, kept = set(), []
  for split in ('heldout', 'teacher', 'train'):
    here = [e for e in examples if e.split == split and e.prompt not in taken]
    taken.update(e.prompt for e in here)
    kept += here
  return kept


# ---- the teacher's extra databases (docs/rl.md) ------------------------------------------------------
# A teacher trained on one wording per domain learns its table and column names by heart and cannot
# query a database it has never seen (the tiny teacher's pass@8 on the student's NL2SQL was 0%). So
# the teacher also trains on TEACHER_WORDINGS more databases per domain, each with its own rows and its
# own mix of the domain's wordings: every logical name is drawn from the three wordings, so a query is
# right only if the names are read off the schema in the prompt. No mix equals a student database's
# wording whole, and no question text of a student split is kept, so no teacher prompt is a student's.
# The tiny teacher reads only short schemas that way (greedy on 48 student RS prompts after 800 steps: the
# right names in 10, all of them HR's two-table schema; experiments/cold_start.md), so it also trains on
# TEACHER_TRAIN_WORDING databases per domain in the training split's wording, as a stronger teacher knows a
# schema convention: their own rows (so their own people, companies and places) and questions, the names
# known, the values still to be copied from the question. The held-out split's wording stays unseen.

TEACHER_WORDINGS = 32
TEACHER_TRAIN_WORDING = 16
TEACHER_PER_TEMPLATE = 6


def teacher_wordings(domain: str, count: int = TEACHER_WORDINGS, seed: int = 0) -> list[dict[str, str]]:
  """`count` distinct mixed wordings of `domain` (logical → physical names), none equal to an instance's."""
  rng = random.Random(f'nl2sql-teacher-wordings:{seed}:{domain}')
  variants = _NAMING[domain]
  taken = {tuple(sorted(v.items())) for v in variants}
  wordings = []
  while len(wordings) < count:
    wording = {key: rng.choice([v[key] for v in variants]) for key in variants[0]}
    if (frozen := tuple(sorted(wording.items()))) not in taken:
      taken.add(frozen)
      wordings.append(wording)
  return wordings


def teacher_suite(directory: str | pathlib.Path | None = None, *, count: int = TEACHER_WORDINGS,
                  train_wording: int = TEACHER_TRAIN_WORDING, per_template: int = TEACHER_PER_TEMPLATE, seed: int = 0
                  ) -> list[Example]:
  """Questions (split 'teacher') over `count` mixed-wording teacher databases per domain, `<dir>/<domain>_t<k>/`,
  and `train_wording` in the training split's wording, `<dir>/<domain>_s<k>/`, each built on first use with
  its own rows; question texts of the student's train and held-out splits are dropped."""
  directory = pathlib.Path(directory or default_dir())
  student = {e.prompt for e in suite(build_databases(directory, seed), seed=seed) if e.split != 'teacher'}
  return [e for e in _teacher_questions(directory, count, train_wording, per_template, seed)
          if e.prompt not in student]


def _teacher_questions(directory: pathlib.Path, count: int, train_wording: int, per_template: int, seed: int
                       ) -> list[Example]:
  """`teacher_suite` before the student's question texts are dropped."""
  rng = random.Random(f'nl2sql-teacher-questions:{seed}')
  examples = []
  for domain in DOMAINS:
    databases = [*((f't{k}', w) for k, w in enumerate(teacher_wordings(domain, count, seed))),
                 *((f's{k}', _NAMING[domain][_TRAIN_VARIANT]) for k in range(train_wording))]
    examples += extra_questions(directory, domain, databases, 'teacher', rng, per_template, seed)
  return dedupe(examples)


def extra_questions(directory: pathlib.Path, domain: str, databases: list[tuple[str, dict[str, str]]], split: str,
                    rng: random.Random, per_template: int, seed: int) -> list[Example]:
  """Questions over databases beyond `INSTANCES`, (label, wording) each, `<dir>/<domain>_<label>/`, each built
  on first use (or when its tables are not the wording's) with rows of its own."""
  examples = []
  for label, wording in databases:
    name = f'{domain}_{label}'
    path = directory / name / f'{name}.sqlite'
    if not path.is_file() or _tables(path) != {wording[key] for key in _TABLE_KEYS[domain]}:
      build_database(path, domain, label, seed, naming=wording)
    examples += _questions(name, path, domain, wording, split, rng, per_template)
  return examples


# ---- curation (docs/rl.md) ----------------------------------------------------------------------

CURATION_REASONS = ('kept', 'gold_failed', 'empty_result', 'too_long')


def curate(examples: list[Example], count_tokens: Callable[[str], int], *, max_tokens: int = 500,
           timeout_s: float = 5.0) -> tuple[list[Example], dict[str, int]]:
  """Keeps a (question, gold SQL, database) triple only if the gold executes in the sandbox, returns at
  least one row with a non-NULL value, and its rendered result is 1–`max_tokens` tokens. Every example
  names its database in `meta['db_path']` (generated and Spider/BIRD-loaded alike).
  Returns (kept, count per reason)."""
  kept, report = [], dict.fromkeys(CURATION_REASONS, 0)
  for example in examples:
    result = sql_tool.execute(example.meta['db_path'], example.answer, timeout_s=timeout_s, max_rows=max_tokens)
    if not result.ok:
      reason = 'gold_failed'
    elif all(value is None for row in result.rows for value in row):  # no rows, or only NULLs (SUM of nothing)
      reason = 'empty_result'
    elif result.truncated or not 1 <= count_tokens(sql_tool.format_result(result, max_chars=100_000)) <= max_tokens:
      reason = 'too_long'
    else:
      reason = 'kept'
      kept.append(example)
    report[reason] += 1
  return kept, report
