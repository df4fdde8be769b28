"""Long-tail scheduling: which worker a request goes to (`dispatch`), which waiting request goes
next (`order`), how long each group's responses will be (`lengths`), and long responses cut into
chunks that go back to the queue between them (`divided`)."""
