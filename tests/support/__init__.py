"""What tests share: factories, process and server helpers, and fakes of the services NomadGPU
talks to (Vast's billing, the Hugging Face Hub, Telegram, webhooks). One module per helper; a
test imports what it needs from here, never from another test module."""
